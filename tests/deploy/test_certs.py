"""make-certs.sh writes a CA and a certificate that Dask's TLS accepts for every role."""

from __future__ import annotations

import shutil
import ssl
import subprocess

import pytest
from cryptography import x509
from distributed.security import Security

from tests.deploy.deployfiles import DOCKER

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="make-certs.sh needs openssl")


def make_certs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(DOCKER / "make-certs.sh"), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_make_certs_writes_a_ca_and_a_certificate_for_every_role(tmp_path):
    out = tmp_path / "certs"
    result = make_certs(str(out), "30")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]  # no CA key left behind
    assert out.joinpath("tls.key").stat().st_mode & 0o077 == 0, "the key is readable by its owner only"

    ca = x509.load_pem_x509_certificate(out.joinpath("ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate(out.joinpath("tls.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {u.dotted_string for u in usages} == {"1.3.6.1.5.5.7.3.1", "1.3.6.1.5.5.7.3.2"}  # server and client
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "scheduler" in names.get_values_for_type(x509.DNSName)

    files = {"tls_ca_file": str(out / "ca.crt")}
    for role in ("scheduler", "worker", "client"):
        files |= {f"tls_{role}_cert": str(out / "tls.crt"), f"tls_{role}_key": str(out / "tls.key")}
    security = Security(require_encryption=True, **files)
    for role in ("scheduler", "worker", "client"):
        context = security.get_listen_args(role)["ssl_context"]
        assert context.verify_mode == ssl.CERT_REQUIRED  # mutual TLS


def test_make_certs_keeps_an_existing_set(tmp_path):
    out = tmp_path / "certs"
    assert make_certs(str(out)).returncode == 0
    before = out.joinpath("tls.crt").read_bytes()
    again = make_certs(str(out))
    assert again.returncode == 0
    assert "keeping" in again.stdout
    assert out.joinpath("tls.crt").read_bytes() == before
