#!/usr/bin/env bash
# Sourced by the Makefile targets: makes sure the servers the tests talk to
# are running, and exports their addresses.
#   IDEM_REDIS_URL   a reachable Redis (127.0.0.1:6379 if it answers, else one started here)
#   IDEM_MONGO_URI   a FerretDB test server built from tools/ferretdb and started here,
#                    unless IDEM_MONGO_URI already points at a server (e.g. a real MongoDB)
#   IDEM_FERRETDB_BIN the FerretDB binary, for tests that stop and restart their own
#   IDEM_POSTGRES_URL a PostgreSQL database: postgres://postgres@127.0.0.1:5432/test if
#                    that server answers, else one started here (installed with apt if
#                    missing; data in .tmp/postgres, trust auth, database test)
#   IDEM_MYSQL_DSN   a MySQL/MariaDB database (go-sql-driver DSN): root@tcp(127.0.0.1:3306)/test;
#                    when nothing answers there, the system MariaDB is started (installed
#                    with apt if missing), root@127.0.0.1 without password, database test
# Everything started here is stopped by the EXIT trap.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP="$ROOT/.tmp"
mkdir -p "$TMP"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; }
trap cleanup EXIT

free_port() { # asks the kernel for a free loopback port
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
    || echo $((20000 + RANDOM % 20000))
}

# --- Redis ---
if [ -z "${IDEM_REDIS_URL:-}" ]; then
  if command -v redis-cli >/dev/null && [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; then
    export IDEM_REDIS_URL=redis://127.0.0.1:6379/0
  else
    if ! command -v redis-server >/dev/null; then
      echo "services: no Redis on 127.0.0.1:6379 and no redis-server; installing it (apt-get install redis-server)" >&2
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools) >&2 \
        || { echo "services: could not install redis-server; start Redis and set IDEM_REDIS_URL" >&2; exit 1; }
    fi
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >"$TMP/redis.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 50); do [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break; sleep 0.1; done
    [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] || { echo "services: redis-server did not start" >&2; cat "$TMP/redis.log" >&2; exit 1; }
    export IDEM_REDIS_URL="redis://127.0.0.1:$port/0"
  fi
fi
echo "services: Redis at $IDEM_REDIS_URL"

# --- MongoDB-wire server (FerretDB) ---
export IDEM_FERRETDB_BIN="$TMP/bin/ferretdb"
if [ ! -x "$IDEM_FERRETDB_BIN" ] || [ -n "$(find "$ROOT/tools/ferretdb" -newer "$IDEM_FERRETDB_BIN" -type f 2>/dev/null)" ]; then
  echo "services: building the FerretDB test server (tools/ferretdb; about a minute the first time)"
  (cd "$ROOT/tools/ferretdb" && GOWORK=off go build -o "$IDEM_FERRETDB_BIN" .) || { echo "services: FerretDB build failed" >&2; exit 1; }
fi
if [ -z "${IDEM_MONGO_URI:-}" ]; then
  rm -f "$TMP/ferretdb.out" # the address of a server started before must not be read while this one starts
  "$IDEM_FERRETDB_BIN" -addr 127.0.0.1:0 >"$TMP/ferretdb.out" 2>"$TMP/ferretdb.log" &
  pids+=($!)
  for _ in $(seq 100); do grep -q '^mongodb://' "$TMP/ferretdb.out" 2>/dev/null && break; sleep 0.1; done
  IDEM_MONGO_URI=$(grep -m1 '^mongodb://' "$TMP/ferretdb.out") || { echo "services: FerretDB did not start" >&2; cat "$TMP/ferretdb.log" >&2; exit 1; }
  export IDEM_MONGO_URI
fi
echo "services: MongoDB-wire server at $IDEM_MONGO_URI"

# --- PostgreSQL ---
pg_answers() { # host port: accepts connections
  if command -v pg_isready >/dev/null; then pg_isready -q -h "$1" -p "$2" -t 2; else (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; fi
}
if [ -z "${IDEM_POSTGRES_URL:-}" ]; then
  if pg_answers 127.0.0.1 5432; then
    export IDEM_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test
  else
    pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
    if [ -z "$pgbin" ]; then
      echo "services: no PostgreSQL on 127.0.0.1:5432 and none installed; installing it (apt-get install postgresql)" >&2
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2 \
        || { echo "services: could not install postgresql; start one and set IDEM_POSTGRES_URL" >&2; exit 1; }
      pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
    fi
    as_pg=() # initdb and postgres refuse to run as root: run them as the postgres user
    if [ "$(id -u)" = 0 ]; then
      id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
      as_pg=(setpriv --reuid=postgres --regid=postgres --init-groups)
    fi
    pgdata="$TMP/postgres" pgsock="$TMP/postgres-sock"
    mkdir -p "$pgsock"
    [ "$(id -u)" = 0 ] && chown postgres: "$pgsock"
    if [ ! -f "$pgdata/PG_VERSION" ]; then
      rm -rf "$pgdata" && mkdir -p "$pgdata" && { [ "$(id -u)" != 0 ] || chown postgres: "$pgdata"; }
      "${as_pg[@]}" "$pgbin/initdb" -D "$pgdata" -U postgres --auth=trust --no-sync >"$TMP/postgres-initdb.log" 2>&1 \
        || { echo "services: initdb failed" >&2; cat "$TMP/postgres-initdb.log" >&2; exit 1; }
    fi
    port=$(free_port)
    "${as_pg[@]}" "$pgbin/postgres" -D "$pgdata" -p "$port" -k "$pgsock" -c listen_addresses=127.0.0.1 \
      -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 >"$TMP/postgres.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do pg_answers 127.0.0.1 "$port" && break; sleep 0.1; done
    pg_answers 127.0.0.1 "$port" || { echo "services: postgres did not start" >&2; cat "$TMP/postgres.log" >&2; exit 1; }
    "$pgbin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
      || "$pgbin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc "CREATE DATABASE test" \
      || { echo "services: could not create database test" >&2; exit 1; }
    export IDEM_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/test"
  fi
fi
echo "services: PostgreSQL at $IDEM_POSTGRES_URL"

# --- MySQL / MariaDB ---
my_answers() { (exec 3<>/dev/tcp/127.0.0.1/3306) 2>/dev/null; }
if [ -z "${IDEM_MYSQL_DSN:-}" ]; then
  if ! my_answers; then
    if [ ! -x /usr/sbin/mariadbd ]; then
      echo "services: nothing on 127.0.0.1:3306 and no MariaDB; installing it (apt-get install mariadb-server)" >&2
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server) >&2 \
        || { echo "services: could not install mariadb-server; start MySQL and set IDEM_MYSQL_DSN" >&2; exit 1; }
    fi
    mkdir -p /run/mysqld && { [ "$(id -u)" != 0 ] || chown mysql: /run/mysqld; }
    # The system server (data in /var/lib/mysql), left running like the one a machine boots with.
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql >&2
    for _ in $(seq 300); do my_answers && break; sleep 0.1; done
    my_answers || { echo "services: MariaDB did not start on 127.0.0.1:3306" >&2; exit 1; }
    # root over TCP without a password, and database test (through the socket, as the OS root).
    mariadb -uroot -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
      GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; CREATE DATABASE IF NOT EXISTS test" >&2 \
      || { echo "services: could not set up root@127.0.0.1 and database test" >&2; exit 1; }
  fi
  export IDEM_MYSQL_DSN='root@tcp(127.0.0.1:3306)/test'
fi
echo "services: MySQL at $IDEM_MYSQL_DSN"
# --- NATS with JetStream ---
#   IDEM_NATS_URL    nats://127.0.0.1:4222 (started with start-stop-daemon if it does not
#                    answer; nats-server installed with apt if missing)
port_answers() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
if [ -z "${IDEM_NATS_URL:-}" ]; then
  if ! port_answers 127.0.0.1 4222; then
    if [ ! -x /usr/sbin/nats-server ]; then
      echo "services: no NATS on 127.0.0.1:4222 and no nats-server; installing it (apt-get install nats-server)" >&2
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server) >&2 \
        || { echo "services: could not install nats-server; start NATS with JetStream and set IDEM_NATS_URL" >&2; exit 1; }
    fi
    mkdir -p /var/lib/nats-server
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
      -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
    for _ in $(seq 100); do port_answers 127.0.0.1 4222 && break; sleep 0.1; done
    port_answers 127.0.0.1 4222 || { echo "services: nats-server did not start" >&2; tail -20 /var/log/nats-server.log >&2; exit 1; }
  fi
  export IDEM_NATS_URL=nats://127.0.0.1:4222
fi
echo "services: NATS at $IDEM_NATS_URL"

# --- RabbitMQ ---
#   IDEM_AMQP_URL    amqp://guest:guest@127.0.0.1:5672/ (rabbitmq-server -detached if it does
#                    not answer; rabbitmq-server installed with apt if missing)
if [ -z "${IDEM_AMQP_URL:-}" ]; then
  if ! port_answers 127.0.0.1 5672; then
    if ! command -v rabbitmq-server >/dev/null; then
      echo "services: no RabbitMQ on 127.0.0.1:5672 and no rabbitmq-server; installing it (apt-get install rabbitmq-server)" >&2
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server) >&2 \
        || { echo "services: could not install rabbitmq-server; start RabbitMQ and set IDEM_AMQP_URL" >&2; exit 1; }
    fi
    rabbitmq-server -detached >&2
    for _ in $(seq 600); do port_answers 127.0.0.1 5672 && break; sleep 0.1; done # the Erlang VM takes seconds
    port_answers 127.0.0.1 5672 || { echo "services: rabbitmq-server did not start" >&2; exit 1; }
  fi
  export IDEM_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/
fi
echo "services: RabbitMQ at $IDEM_AMQP_URL"

# --- Chromium (tests/console drives it headless through chromedp) ---
#   IDEM_CHROMIUM    the browser binary: /usr/bin/chromium (Debian's chromium package,
#                    installed with apt if missing) unless already set
if [ -z "${IDEM_CHROMIUM:-}" ]; then
  if [ ! -x /usr/bin/chromium ]; then
    echo "services: no /usr/bin/chromium; installing it (apt-get install chromium)" >&2
    as_root=(); [ "$(id -u)" = 0 ] || as_root=(sudo -n)
    ("${as_root[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq chromium) >&2 \
      || { echo "services: could not install chromium; install it or set IDEM_CHROMIUM (tests/console)" >&2; exit 1; }
  fi
  export IDEM_CHROMIUM=/usr/bin/chromium
fi
echo "services: Chromium at $IDEM_CHROMIUM"
