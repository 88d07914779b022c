"""Network plumbing every process of a job shares; pure (standard library only), below ``config``.

- ``auth``    the job secret and run-scoped keys every HTTP listener checks;
- ``tls``     one TLS context per process for every HTTP client.
"""
