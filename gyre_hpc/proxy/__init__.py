"""The proxy: the one endpoint the agent harness calls (SGLang's ``/generate``). It routes runs to rollout engines
(sticky per run, least-loaded otherwise), records TITO, and moves a leaving cell's unfinished requests to other
engines without the harness seeing an error. Pure parts: ``routing`` and ``calls``; live parts: ``service``
(asyncio), ``server`` (HTTP), ``launch``, ``client``. See docs/proxy.md.
"""
