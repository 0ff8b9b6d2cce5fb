"""tests/deploy: the real tools (docker, prometheus, promtool, hadolint, kubectl kustomize,
kubernetes-validate, docker compose). Every test that needs one of them is marked `deploy` and runs
in `make test-deploy` (after .ci/deploy-tools.sh installed them); `make test` runs only the checks
that need none (file contents, metric names, shell syntax), so none of its tests skips for a tool.
"""
