"""The deploy files parse and have the shape the READMEs promise (no container engine needed)."""

from __future__ import annotations

import importlib.metadata
import re
import sys

import pytest

from tests.deploy import deployfiles as files
from tests.deploy.deployfiles import COMPOSE_FILE, DOCKER, KUBERNETES, MANIFESTS, ROOT, SLURM

TLS_FLAGS = ("--tls-ca-file", "--tls-cert", "--tls-key")


def test_every_deploy_folder_has_a_readme_that_covers_the_basics():
    for folder in (DOCKER, KUBERNETES, SLURM):
        text = (folder / "README.md").read_text().lower()
        for topic in ("prerequisites", "dashboard", "tls", "nightly", "retrain"):
            assert topic in text, f"{folder.relative_to(ROOT)}/README.md does not mention {topic!r}"


def test_every_yaml_file_parses():
    for path in [COMPOSE_FILE, *MANIFESTS]:
        assert files.load_yaml_documents(path), f"{path} holds no YAML document"


# -- Dockerfile --------------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n(\s*#[^\n]*\n)*", " ", (DOCKER / "Dockerfile").read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_dockerfile_base_image_is_the_pinned_python_of_this_venv():
    froms = [args for keyword, args in _dockerfile() if keyword == "FROM"]
    assert froms == ["python:3.11.7-slim"]
    major_minor = ".".join(froms[0].split(":")[1].split(".")[:2])
    assert major_minor == f"{sys.version_info.major}.{sys.version_info.minor}"


def test_dockerfile_pins_the_versions_installed_here():
    runs = " ".join(args for keyword, args in _dockerfile() if keyword == "RUN")
    pins = dict(re.findall(r"\b([A-Za-z0-9_.-]+)==([0-9][^\s'\"]*)", runs))
    for package in ("dask", "distributed", "zarr"):
        assert pins.get(package) == importlib.metadata.version(package), f"{package} pinned {pins.get(package)}"
    for package, version in pins.items():
        try:
            installed = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue  # pinned for the image only
        assert version == installed, f"the Dockerfile pins {package}=={version}; this venv has {installed}"


def test_dockerfile_installs_the_package_with_its_s3_extra_from_the_repository():
    instructions = _dockerfile()
    copies = [args.split() for keyword, args in instructions if keyword == "COPY"]
    for sources in copies:
        for source in sources[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: not in the build context (the repository root)"
    assert any("pip install '.[s3]'" in args for keyword, args in instructions if keyword == "RUN")
    assert ("USER", "respattn") in instructions, "the image runs as a non-root user"


def test_dockerignore_keeps_the_context_small():
    lines = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert patterns[0] == "**", "everything is excluded first"
    assert {"!pyproject.toml", "!README.md", "!dist_respattn/"} <= set(patterns)
    assert "**/__pycache__" in patterns, "numba's compiled caches of this machine stay out of the image"


# -- compose.yaml --------------------------------------------------------------------------------


def test_compose_has_the_cluster_the_jobs_and_the_volumes():
    compose = files.compose()
    services = compose["services"]
    assert {"scheduler", "worker-1", "worker-2", "make-data", "fit"} <= set(services)
    assert set(compose["volumes"]) >= {"stores", "models", "certs"}
    images = {service["image"] for service in services.values()}
    assert len(images) == 1, f"one image serves every role, found {images}"
    for name in ("make-data", "fit"):
        assert services[name]["restart"] == "no", f"{name} is a one-shot job"
    fit_needs = services["fit"]["depends_on"]
    assert fit_needs["make-data"]["condition"] == "service_completed_successfully"
    assert {"worker-1", "worker-2"} <= set(fit_needs)


def test_compose_publishes_the_dashboard_on_loopback_only():
    services = files.compose()["services"]
    assert services["scheduler"]["ports"] == ["127.0.0.1:8787:8787"]
    for name, service in services.items():
        if name != "scheduler":
            assert "ports" not in service, f"{name} publishes ports"


def test_compose_mounts_the_certificates_read_only_and_uses_tls_everywhere():
    services = files.compose()["services"]
    for name, service in services.items():
        if name == "certs":
            assert "certs:/certs" in service["volumes"]
            continue
        if name == "make-data":
            continue  # writes stores, talks to no cluster
        assert "certs:/certs:ro" in service["volumes"], f"{name} does not mount the certificates read-only"
        (argv,) = files.argv_of(service["command"])
        for flag in TLS_FLAGS:
            assert flag in argv, f"{name}: {flag} missing"
        addresses = [word for word in argv if "://" in word]
        assert all(a.startswith("tls://") for a in addresses), f"{name}: {addresses}"


def test_the_workers_and_the_jobs_mount_the_stores_and_the_scheduler_only_the_certificates():
    """Workers open the stores their tasks name; the scheduler only passes tasks on, so it gets no store."""
    services = files.compose()["services"]
    for name in ("worker-1", "worker-2", "fit", "retrain"):
        assert "stores:/stores:ro" in services[name]["volumes"], f"{name} cannot read the stores"
    assert services["scheduler"]["volumes"] == ["certs:/certs:ro"], "the scheduler mounts more than the certificates"


def test_make_data_writes_train_and_validation_into_the_stores_volume():
    service = files.compose()["services"]["make-data"]
    assert "stores:/stores" in service["volumes"]
    synth = [c.argv for c in files.compose_commands() if c.where.endswith("make-data.command") and "synth" in c.argv]
    outputs = {argv[2] for argv in synth}
    assert {"/stores/train.zarr", "/stores/validation-partial.zarr"} <= outputs


# -- Kubernetes --------------------------------------------------------------------------------


def test_manifests_have_the_expected_kinds_and_api_versions():
    kinds = {
        (doc["apiVersion"], doc["kind"]): path.name for path in MANIFESTS for doc in files.load_yaml_documents(path)
    }
    assert kinds == {
        ("kubernetes.dask.org/v1", "DaskCluster"): "daskcluster.yaml",
        ("kubernetes.dask.org/v1", "DaskJob"): "daskjob.yaml",
        ("v1", "PersistentVolumeClaim"): "daskjob.yaml",
        ("batch/v1", "CronJob"): "cronjob-retrain.yaml",
    }


def _cluster_specs():
    """(name, DaskCluster spec) of the long-lived cluster and of the DaskJob's cluster."""
    cluster = files.only(files.manifest("daskcluster.yaml"), "DaskCluster")
    job = files.only(files.manifest("daskjob.yaml"), "DaskJob")
    return [(cluster["metadata"]["name"], cluster["spec"]), (job["metadata"]["name"], job["spec"]["cluster"]["spec"])]


@pytest.mark.parametrize("index", [0, 1], ids=["DaskCluster", "DaskJob"])
def test_dask_clusters_run_tls_with_secret_certificates_and_a_cluster_ip_dashboard(index):
    name, spec = _cluster_specs()[index]
    service = spec["scheduler"]["service"]
    assert service["type"] == "ClusterIP"
    assert service["selector"] == {"dask.org/cluster-name": name, "dask.org/component": "scheduler"}
    assert {p["port"] for p in service["ports"]} == {8786, 8787}
    (scheduler,) = spec["scheduler"]["spec"]["containers"]
    assert scheduler["args"][:4] == ["dask", "scheduler", "--preload", "dist_respattn.monitor"]
    (worker,) = spec["worker"]["spec"]["containers"]
    assert worker["args"][:3] == ["dask", "worker", f"tls://{name}-scheduler:8786"]
    assert spec["worker"]["replicas"] >= 2
    for pod in (spec["scheduler"]["spec"], spec["worker"]["spec"]):
        _assert_certificates_from_the_secret(pod)
    assert worker["resources"]["requests"]["memory"] == worker["resources"]["limits"]["memory"]
    assert worker["resources"]["requests"]["cpu"] == worker["resources"]["limits"]["cpu"] == "1"


def _assert_certificates_from_the_secret(pod):
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["containers"]:
        words = [*container.get("command", []), *container.get("args", [])]
        for flag in TLS_FLAGS:
            assert flag in words, f"{container['name']}: {flag} missing"
            assert words[words.index(flag) + 1].startswith("/certs/")
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/certs"]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["secret"]["secretName"] == "respattn-tls"


def test_the_job_and_the_retrain_use_tls_and_s3_credentials_from_a_secret():
    job = files.only(files.manifest("daskjob.yaml"), "DaskJob")
    cron = files.only(files.manifest("cronjob-retrain.yaml"), "CronJob")
    pods = [job["spec"]["job"]["spec"], cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    for pod in pods:
        _assert_certificates_from_the_secret(pod)
        (container,) = pod["containers"]
        scheduler = container["args"][container["args"].index("--scheduler") + 1]
        assert scheduler.startswith("tls://")
        assert any(word.startswith("s3://") for word in container["args"])
    # The workers open the stores their tasks name, so they need the credentials as the jobs do.
    worker_pods = [spec["worker"]["spec"] for _, spec in _cluster_specs()]
    for pod in pods + worker_pods:
        (container,) = pod["containers"]
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
        assert set(env) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"}
        assert {ref["name"] for ref in env.values()} == {"respattn-s3"}
        assert env["AWS_ENDPOINT_URL"].get("optional") is True
        assert not env["AWS_ACCESS_KEY_ID"].get("optional")


@pytest.mark.parametrize("index", [0, 1], ids=["DaskCluster", "DaskJob"])
def test_the_schedulers_get_no_s3_credentials(index):
    """Tasks carry a store's location and the workers open it: the scheduler never reads S3."""
    _, spec = _cluster_specs()[index]
    pod = spec["scheduler"]["spec"]
    (container,) = pod["containers"]
    names = [e["name"] for e in container.get("env", [])]
    assert not [name for name in names if name.startswith("AWS_")], f"the scheduler gets {names}"
    assert "envFrom" not in container, "the scheduler takes variables from a Secret or ConfigMap"
    assert "respattn-s3" not in repr(pod), "the scheduler's pod refers to the S3 Secret"
    assert [v["secret"]["secretName"] for v in pod["volumes"]] == ["respattn-tls"]


def test_the_retrain_cronjob_runs_nightly_one_at_a_time():
    cron = files.only(files.manifest("cronjob-retrain.yaml"), "CronJob")
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert _is_daily_cron(spec["schedule"]), spec["schedule"]
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy needs it
    (container,) = pod["containers"]
    assert container["args"][:2] == ["dist-respattn", "retrain"]
    assert container["args"][container["args"].index("--keep") + 1] == "10"


_CRON_FIELDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


def _is_daily_cron(schedule: str) -> bool:
    """A valid 5-field cron expression (numbers, ranges, lists, steps, *) that fires once a day."""
    fields = schedule.split()
    if len(fields) != 5:
        return False
    for field, (low, high) in zip(fields, _CRON_FIELDS, strict=True):
        for part in field.split(","):
            match = re.fullmatch(r"(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?", part)
            if not match:
                return False
            numbers = [int(n) for n in match.group(2, 3) if n is not None]
            if any(not low <= n <= high for n in numbers) or match.group(4) == "0":
                return False
    minute, hour = fields[:2]
    return minute.isdigit() and hour.isdigit() and fields[2:] == ["*", "*", "*"]


def test_cron_check_rejects_bad_schedules():
    assert _is_daily_cron("30 2 * * *")
    for bad in ("30 2 * *", "60 2 * * *", "30 24 * * *", "*/5 * * * *", "30 2 * * * *", "a b c d e"):
        assert not _is_daily_cron(bad), bad


def test_dashboard_is_never_published_beyond_the_cluster():
    for path in MANIFESTS:
        for doc in files.load_yaml_documents(path):
            text = repr(doc)
            for exposed in ("LoadBalancer", "NodePort", "hostPort", "Ingress"):
                assert exposed not in text, f"{path.name} exposes the cluster via {exposed}"


def test_images_are_the_same_everywhere_in_kubernetes():
    documents = [doc for path in MANIFESTS for doc in files.load_yaml_documents(path)]
    images = {container["image"] for doc in documents for _, container in files.containers(doc)}
    assert len(images) == 1, images
