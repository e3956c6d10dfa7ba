"""compose.yaml's commands, run as local processes on 127.0.0.1: the real cluster, TLS and all.

The scheduler, the two workers, make-data, fit and retrain run exactly as compose.yaml writes them,
after the substitutions of :func:`localizer` and nothing else: the host name and ports, the
volumes' mount points, the sizes of the sampled stores, and a cap of 1 EM iteration on the fit and the retrain.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.deploy import deployfiles as files
from tests.deploy.processes import (
    Localizer,
    environment,
    free_ports,
    get,
    make_certificates,
    processes,
    run,
    wait_for_http,
    wait_for_workers,
)

pytestmark = pytest.mark.slow  # every test here starts a cluster or a command


def localizer(tmp: Path, port: int, dashboard: int) -> Localizer:
    """The documented mapping from the containers' world to this machine's."""
    return Localizer(
        [
            # Host names and ports: the compose network's `scheduler` is this machine's loopback.
            ("tls://scheduler:8786", f"tls://127.0.0.1:{port}"),
            ("--port 8786", f"--port {port}"),
            ("--dashboard-address :8787", f"--dashboard-address 127.0.0.1:{dashboard}"),
            # The volumes' mount points.
            ("/certs/", f"{tmp}/certs/"),
            ("/stores/", f"{tmp}/stores/"),
            ("/models/", f"{tmp}/models/"),
            # Sizes: 20,000 training rows in 5 partitions (so both workers get tasks) instead of
            # 1,000,000 rows, 4,000 held-out rows, and a vocabulary of 40 symbols and 12 targets.
            ("--rows 1000000", "--rows 20000 --chunk-rows 2048"),
            ("--rows 99999", "--rows 3999"),
            ("--symbols 2000", "--symbols 40"),
            ("--targets 2000", "--targets 12"),
            # Iterations: 1, for the fit and the retrain. What is tested is that the commands run on this
            # cluster as written, not how many iterations the fit takes to converge; a fit capped at 1 still
            # ends as a finished fit, which `--resume` then reports.
            ("--resume", "--resume --max-iter 1"),
            ("--keep 10", "--keep 10 --max-iter 1"),
        ]
    )


def test_compose_cluster_fits_and_retrains_over_tls(tmp_path):
    services = files.compose()["services"]
    port, dashboard = free_ports(2)
    local = localizer(tmp_path, port, dashboard)
    make_certificates(tmp_path / "certs")
    for volume in ("stores", "models", "run"):
        (tmp_path / volume).mkdir()
    cwd = tmp_path / "run"
    env = environment(TMPDIR=str(cwd))  # the workers' scratch space goes under TMPDIR
    url = f"http://127.0.0.1:{dashboard}"

    with processes(tmp_path / "logs") as group:
        group.start("scheduler", local.argv(files.argv_of(services["scheduler"]["command"])[0]), env=env, cwd=cwd)
        wait_for_http(f"{url}/health", group)
        # The preloaded monitor serves its page before any fit has connected (preloads run just
        # after the web server starts, hence a wait).
        wait_for_http(f"{url}/respattn/fits", group, timeout=30)
        for name in ("worker-1", "worker-2"):
            group.start(name, local.argv(files.argv_of(services[name]["command"])[0]), env=env, cwd=cwd)

        shell, flags, script = services["make-data"]["command"]
        made = run([shell, flags, local.text(script)], env=env, cwd=cwd)
        assert made.returncode == 0, made.stderr
        assert (tmp_path / "stores" / "validation.zarr").is_dir()
        assert not (tmp_path / "stores" / "validation-partial.zarr").exists()

        wait_for_workers(url, 2, group)
        fitted = run(local.argv(files.argv_of(services["fit"]["command"])[0]), env=env, cwd=cwd)
        assert fitted.returncode == 0, fitted.stderr
        assert "EM " in fitted.stdout
        assert (tmp_path / "models" / "demo" / "latest.json").is_file()
        # `docker compose up` again reruns the job: --resume reports the finished fit and exits 0.
        again = run(local.argv(files.argv_of(services["fit"]["command"])[0]), env=env, cwd=cwd)
        assert again.returncode == 0, again.stderr

        # The monitor the scheduler preloaded has seen the fit, on the page and in the metrics.
        status, page = get(f"{url}/respattn/fits")
        assert status == 200, page
        status, body = get(f"{url}/respattn/api/fits.json")
        assert status == 200, body
        assert any(str(tmp_path / "stores" / "train.zarr") in json.dumps(fit) for fit in json.loads(body)["fits"])
        status, metrics = get(f"{url}/metrics")
        assert status == 200
        assert "dask_scheduler_workers" in metrics
        assert "dist_respattn_fit_iteration{" in metrics

        # The nightly retrain's command: the first run publishes version 1 into an empty registry.
        retrained = run(local.argv(files.argv_of(services["retrain"]["command"])[0]), env=env, cwd=cwd)
        assert retrained.returncode == 0, retrained.stderr
        (listing,) = [c for c in files.readme_commands() if c.where.startswith("docker/") and "list" in c.argv]
        listed = run(local.argv([*listing.argv, "--json"]), env=env, cwd=cwd)
        assert listed.returncode == 0, listed.stderr
        assert len(json.loads(listed.stdout)["versions"]) == 1
        group.check_alive()
    local.check_all_used()
