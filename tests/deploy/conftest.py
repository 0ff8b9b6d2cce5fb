"""tests/deploy: the real tools (docker, prometheus, promtool, hadolint, kubectl kustomize,
kubernetes-validate, docker compose). Quick checks run in `make test`; tests marked `deploy`
(container build and run, a live Prometheus) are the `make test-deploy` ones.
"""
