"""The Kubernetes manifests' commands, run as local processes, with an S3 server standing in for S3.

daskjob.yaml's scheduler, workers and fit, and cronjob-retrain.yaml's retrain, run as the manifests
write them, with the s3:// URLs unchanged: a local moto server plays S3, reached the way the pods
reach theirs, through the AWS_* variables of the Secret respattn-s3. Each process gets the variables
its container declares and no others, so the scheduler, which declares none, cannot reach the S3
server at all (it does not even know its address): the fit and the retrain passing shows that the
scheduler needs no access to the stores or the registry. The stores are made with the README's own
commands. Substituted: host names and ports, the mount points, the sizes, a cap of 1 EM iteration on
the fit and the retrain, and the worker names Kubernetes fills into $(DASK_WORKER_NAME).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.deploy import deployfiles as files
from tests.deploy.processes import (
    BIN,
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

pytestmark = [
    pytest.mark.slow,  # every test here starts a cluster or a command
    pytest.mark.skipif(not (BIN / "moto_server").exists(), reason="needs moto[server] (the test extra)"),
]

#: What the Secret respattn-s3 holds, for the local S3 server.
SECRET = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def localizer(tmp: Path, port: int, dashboard: int) -> Localizer:
    return Localizer(
        [
            # Both clusters' scheduler Services are this machine's loopback.
            ("tls://respattn-fit-scheduler:8786", f"tls://127.0.0.1:{port}"),
            ("tls://respattn-scheduler:8786", f"tls://127.0.0.1:{port}"),
            ("--port 8786", f"--port {port}"),
            ("--dashboard-address :8787", f"--dashboard-address 127.0.0.1:{dashboard}"),
            # The mount points of the Secret respattn-tls and of the claim respattn-models.
            ("/certs/", f"{tmp}/certs/"),
            ("/models/", f"{tmp}/models/"),
            # Sizes: 8,192 training rows in one partition (every S3 request costs ~10 ms here, and
            # each task opens its store anew), 2,048 held-out rows, 40 symbols and 12 targets.
            ("--rows 1000000", "--rows 8192"),
            ("--rows 99999", "--rows 2047"),
            ("--symbols 2000", "--symbols 40"),
            ("--targets 2000", "--targets 12"),
            # Iterations: 1, for the fit and the retrain (what is tested is where each process reaches
            # S3 from, not how many iterations the fit takes to converge).
            ("--resume", "--resume --max-iter 1"),
            ("--keep ", "--max-iter 1 --keep "),
        ]
    )


def _secret_env(container: dict, endpoint: str) -> dict[str, str]:
    """The container's AWS_* variables with the Secret's values (the endpoint: the local server)."""
    values = {**SECRET, "AWS_ENDPOINT_URL": endpoint}
    assert "envFrom" not in container, f"{container['name']}: envFrom is not modelled here"
    env = container.get("env", [])
    names = [e["name"] for e in env if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "respattn-s3"]
    return {name: values[name] for name in names}


def _container(pod: dict) -> dict:
    (container,) = pod["containers"]
    return container


def test_daskjob_fits_and_cronjob_retrains_against_s3_over_tls(tmp_path):
    job = files.only(files.manifest("daskjob.yaml"), "DaskJob")["spec"]
    cron = files.only(files.manifest("cronjob-retrain.yaml"), "CronJob")["spec"]["jobTemplate"]["spec"]["template"]
    cluster = job["cluster"]["spec"]
    s3_port, port, dashboard = free_ports(3)
    endpoint = f"http://127.0.0.1:{s3_port}"
    local = localizer(tmp_path, port, dashboard)
    make_certificates(tmp_path / "certs")
    (tmp_path / "models").mkdir()
    cwd = tmp_path / "run"
    cwd.mkdir()
    base = environment(TMPDIR=str(cwd))
    url = f"http://127.0.0.1:{dashboard}"

    with processes(tmp_path / "logs") as group:
        group.start("s3", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(s3_port)], env=base, cwd=cwd)
        wait_for_http(f"{endpoint}/", group)
        bucket = urllib.request.Request(f"{endpoint}/respattn-data", method="PUT")
        with urllib.request.urlopen(bucket, timeout=5) as response:
            assert response.status == 200

        # The scheduler declares no S3 variables, so it runs without any; its HOME is empty too, as
        # in its pod (no ~/.aws of this machine to fall back on).
        scheduler = _container(cluster["scheduler"]["spec"])
        home = tmp_path / "scheduler-home"
        home.mkdir()
        scheduler_env = {**base, **_secret_env(scheduler, endpoint), "HOME": str(home)}
        assert not [name for name in scheduler_env if name.startswith("AWS_")], "the scheduler got S3 settings"
        group.start("scheduler", local.argv(scheduler["args"]), env=scheduler_env, cwd=cwd)
        wait_for_http(f"{url}/health", group)
        wait_for_http(f"{url}/respattn/fits", group, timeout=30)  # the preloaded monitor, before any fit
        worker = _container(cluster["worker"]["spec"])
        for i in range(cluster["worker"]["replicas"]):
            # What the operator sets $(DASK_WORKER_NAME) to, one name a pod.
            argv = [w.replace("$(DASK_WORKER_NAME)", f"respattn-fit-default-worker-{i}") for w in worker["args"]]
            group.start(f"worker-{i}", local.argv(argv), env={**base, **_secret_env(worker, endpoint)}, cwd=cwd)

        # The README's commands write the stores to the bucket, with the Secret's credentials.
        s3_env = {**base, **SECRET, "AWS_ENDPOINT_URL": endpoint}
        readme = [c for c in files.readme_commands() if c.where.startswith("kubernetes/")]
        for command in [c for c in readme if c.argv[1] == "synth"]:
            made = run(local.argv(command.argv), env=s3_env, cwd=cwd)
            assert made.returncode == 0, f"{command}\n{made.stderr}"

        wait_for_workers(url, cluster["worker"]["replicas"], group)
        runner = _container(job["job"]["spec"])
        fitted = run(local.argv(runner["args"]), env={**base, **_secret_env(runner, endpoint)}, cwd=cwd)
        assert fitted.returncode == 0, fitted.stderr
        assert (tmp_path / "models" / "respattn-fit" / "latest.json").is_file()
        status, body = get(f"{url}/respattn/api/fits.json")
        assert status == 200
        assert "s3://respattn-data/corpus/train.zarr" in body

        # The nightly retrain publishes its first version into the registry on S3.
        retrain = _container(cron["spec"])
        retrained = run(local.argv(retrain["args"]), env={**base, **_secret_env(retrain, endpoint)}, cwd=cwd)
        assert retrained.returncode == 0, retrained.stderr
        (listing,) = [c for c in readme if c.argv[1:3] == ("models", "list")]
        listed = run(local.argv([*listing.argv, "--json"]), env=s3_env, cwd=cwd)
        assert listed.returncode == 0, listed.stderr
        assert len(json.loads(listed.stdout)["versions"]) == 1
        group.check_alive()
    local.check_all_used()
