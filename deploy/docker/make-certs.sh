#!/bin/sh
# Make the TLS material of one dist-respattn cluster: a private CA and one certificate signed by it,
# which the scheduler, the workers and the clients (fit, evaluate, retrain) all present. Dask's TLS
# is mutual: every side must show a certificate of the cluster's CA, so nobody without these files
# can join the cluster or submit work to it.
#
#   sh make-certs.sh [OUT_DIR] [DAYS]      (defaults: ./certs, 365)
#
# Writes OUT_DIR/ca.crt, OUT_DIR/tls.crt and OUT_DIR/tls.key (mode 600) with OpenSSL. The CA's own
# key is discarded, so no further certificate can be signed by this CA: to rotate, delete OUT_DIR,
# run the script again and restart the cluster. Extra subject names for the certificate (they are
# informational: Dask checks the CA, not host names) go in $TLS_NAMES, e.g.
#   TLS_NAMES="DNS:dask.example.org,IP:10.0.0.5" sh make-certs.sh
# An existing OUT_DIR/tls.key is left alone, so running the script twice is harmless.
set -eu

out=${1:-./certs}
days=${2:-365}
names="DNS:scheduler,DNS:localhost,IP:127.0.0.1,DNS:respattn-scheduler,DNS:respattn-fit-scheduler"
names="$names${TLS_NAMES:+,$TLS_NAMES}"

if [ -s "$out/tls.key" ]; then
    echo "make-certs.sh: $out/tls.key exists; keeping the certificates in $out"
    exit 0
fi

umask 077
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One config file with both profiles, so the result does not depend on the system's openssl.cnf.
cat >"$work/openssl.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
[ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[leaf]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = $names
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF

openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -config "$work/openssl.cnf" -extensions ca -subj "/CN=dist-respattn cluster CA" \
    -days "$days" -keyout "$work/ca.key" -out "$work/ca.crt"
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -config "$work/openssl.cnf" -subj "/CN=dist-respattn" \
    -keyout "$work/tls.key" -out "$work/tls.csr"
openssl x509 -req -in "$work/tls.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -set_serial "0x$(openssl rand -hex 16)" \
    -days "$days" -extfile "$work/openssl.cnf" -extensions leaf -out "$work/tls.crt"

# The key last: its presence marks a complete set (see the check at the top).
cp "$work/ca.crt" "$work/tls.crt" "$out/"
cp "$work/tls.key" "$out/tls.key"
chmod 644 "$out/ca.crt" "$out/tls.crt"
chmod 600 "$out/tls.key"
echo "make-certs.sh: wrote $out/ca.crt, $out/tls.crt and $out/tls.key (valid $days days)"
