#!/usr/bin/env bash
# A self-signed CA, a server certificate and a client certificate (for mTLS), for development and
# tests only (docs/deploy.md "TLS and tokens"; production certificates come from your CA or
# cert-manager). EC P-256 keys, valid DAYS days (default 30).
#   deploy/scripts/make-dev-certs.sh OUT_DIR [SERVER_NAMES]
# SERVER_NAMES: subjectAltName entries of the server certificate
# (default DNS:localhost,IP:127.0.0.1; add your service's DNS name, e.g. DNS:transformer-serving).
# Writes OUT_DIR/{ca.pem,ca.key,server.pem,server.key,client.pem,client.key}.
set -euo pipefail
out=${1:?usage: $0 OUT_DIR [SERVER_NAMES]}
names=${2:-DNS:localhost,IP:127.0.0.1}
days=${DAYS:-30}
mkdir -p "$out"
cd "$out"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; chmod 600 "$1"; }

key ca.key
openssl req -x509 -new -key ca.key -out ca.pem -days "$days" -subj "/CN=transformer-serving dev CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

sign() {  # sign NAME CN EXTENSIONS: NAME.key + NAME.pem signed by the CA
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
sign server transformer-serving "subjectAltName=$names
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature"
sign client transformer-serving-client "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature"
rm -f ca.srl
