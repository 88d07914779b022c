"""The HTTP plumbing every service and client of a job shares.

- ``auth``     the job secret and run-scoped keys every HTTP listener checks (pure, standard library);
- ``tls``      one TLS context per process for every HTTP client;
- ``serving``  the service processes' shared plumbing (the local engine, the proxy); edge: uvicorn/FastAPI.
"""
