#!/bin/sh
# Makes the certificates the TLS tests and the TLS benchmark use, with the
# openssl CLI, into the directory $1 (created):
#   ca, other-ca              two unrelated self-signed CAs
#   server, client            signed by ca (server: SAN IP:127.0.0.1 and
#                             DNS:localhost, serverAuth; client: clientAuth)
#   other-server, other-client  the same, signed by other-ca
#   peer, other-peer          cairn-agent peer transport certificates (both
#                             serverAuth and clientAuth), signed by ca and
#                             other-ca
#   expired                   a certificate signed by ca (serverAuth and
#                             clientAuth), valid only in January 2020
# Each NAME as NAME.crt and NAME.key (PEM, EC P-256, unencrypted).
set -eu
out=$1
mkdir -p "$out"
cd "$out"
run() {
  "$@" >openssl.log 2>&1 || { echo "make_test_certs: failed: $*" >&2; cat openssl.log >&2; exit 1; }
}
key_and_csr() {
  run openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$1"
}
ca() {
  run openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.crt" -days 3650 -subj "/CN=$1" \
    -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign
}
leaf() {  # name ca extendedKeyUsage
  key_and_csr "$1"
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=%s\n' \
    "$3" >"$1.ext"
  run openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" \
    -CAcreateserial -days 3650 -extfile "$1.ext" -out "$1.crt"
}
ca ca
ca other-ca
leaf server ca serverAuth
leaf client ca clientAuth
leaf other-server other-ca serverAuth
leaf other-client other-ca clientAuth
leaf peer ca serverAuth,clientAuth
leaf other-peer other-ca serverAuth,clientAuth
# openssl 3.0's x509 cannot backdate; `openssl ca` takes explicit dates.
mkdir -p expired-db
: >expired-db/index.txt
echo 01 >expired-db/serial
cat >expired-db/ca.cnf <<CNF
[ca]
default_ca = d
[d]
database = expired-db/index.txt
new_certs_dir = expired-db
serial = expired-db/serial
default_md = sha256
policy = p
[p]
commonName = supplied
CNF
key_and_csr expired
run openssl ca -batch -config expired-db/ca.cnf -cert ca.crt -keyfile ca.key \
  -in expired.csr -out expired.crt -startdate 20200101000000Z \
  -enddate 20200201000000Z -extfile peer.ext
rm -f ./*.csr ./*.ext ./*.srl openssl.log
rm -rf expired-db
