#!/usr/bin/env bash
# The container test: build the sampler image and run docker-compose.yml for real.
#
#   scripts/container-test.sh            # or: make container-test
#
# 1. build the image;
# 2. compose up: a sampler, FEEDMUX_TRAINERS trainers and a checker in containers;
#    passes if every container exits 0 and the checker found every example
#    exactly once in every epoch across the trainers;
# 3. a trainer on the host against the sampler's published ports (one epoch,
#    every example exactly once); skipped if no Python with feedmux is found
#    (.venv/bin/python, python3, or FEEDMUX_HOST_PYTHON);
# 4. the template for one's own sampler (examples/container): its image built FROM the
#    image of step 1, serving example images mounted read-only, with the host's IPC and
#    PID namespaces; a trainer on the host reads two epochs through the shared-memory
#    pool (every image once an epoch, held arrays unchanged). Skipped as step 3 is.
#
# Everything it starts is torn down at the end, whatever happens (containers,
# networks, volumes; the image stays, as a build cache). Every step is bounded.
#
# Engine: `docker compose` if a Docker engine answers, else podman-compose (or
# CONTAINER_COMPOSE="docker compose" / "podman-compose" / "docker-compose").
# Settings: FEEDMUX_BASE_IMAGE (base of the build, default python:3.11-slim;
# e.g. a local image where no registry is reachable), FEEDMUX_FILES,
# FEEDMUX_EXAMPLES, FEEDMUX_EPOCHS, FEEDMUX_WORKERS, FEEDMUX_TRAINERS (as in
# docker-compose.yml), FEEDMUX_TEST_BUILD_TIMEOUT (900 s) and
# FEEDMUX_TEST_RUN_TIMEOUT (240 s).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
build_timeout=${FEEDMUX_TEST_BUILD_TIMEOUT:-900}
run_timeout=${FEEDMUX_TEST_RUN_TIMEOUT:-240}
export FEEDMUX_FILES=${FEEDMUX_FILES:-4}
export FEEDMUX_EXAMPLES=${FEEDMUX_EXAMPLES:-25000}
export FEEDMUX_EPOCHS=${FEEDMUX_EPOCHS:-3}
export FEEDMUX_WORKERS=${FEEDMUX_WORKERS:-1}
export FEEDMUX_TRAINERS=${FEEDMUX_TRAINERS:-2}

say() { printf 'container-test: %s\n' "$*"; }
die() { say "FAILED: $*" >&2; exit 1; }

# -- the engine ---------------------------------------------------------------------------
if [ -n "${CONTAINER_COMPOSE:-}" ]; then
  read -ra compose <<<"$CONTAINER_COMPOSE"
elif command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1 \
     && timeout 20 docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v podman-compose >/dev/null && command -v podman >/dev/null; then
  compose=(podman-compose)
elif command -v docker-compose >/dev/null && timeout 20 docker info >/dev/null 2>&1; then
  compose=(docker-compose)
else
  say "no container engine: need a Docker engine with 'docker compose', or podman and podman-compose" >&2
  exit 2
fi
case "${compose[0]}" in
  podman-compose) engine=podman ;;
  *) engine=docker ;;
esac
engine_version=$(timeout 20 "$engine" version --format '{{.Client.Version}}' 2>/dev/null || echo '?')

# -- scratch space, host ports, and the teardown -----------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/feedmux-container-test.XXXXXX")
project="feedmux-test-$$"
host_project="$project-host"
template_project="$project-template"
template_file=examples/container/compose.yml
projects=()  # each "NAME" or "NAME COMPOSE_FILE": what the teardown takes down
# Empty: the engine publishes the sampler's ports on free host ports of its own
# choosing, read back with `compose port` (no port is probed and released here).
export FEEDMUX_DATA_PORT=${FEEDMUX_DATA_PORT-}
export FEEDMUX_CONTROL_PORT=${FEEDMUX_CONTROL_PORT-}

down() {  # down PROJECT [COMPOSE_FILE]: remove its containers, network and volumes
  local file=()
  [ -z "${2:-}" ] || file=(-f "$2")
  timeout 180 "${compose[@]}" ${file[@]+"${file[@]}"} -p "$1" down -v -t 5 --remove-orphans \
    >>"$work/down.log" 2>&1
}
teardown() {
  local code=$? entry project_name project_file
  trap - EXIT INT TERM
  for entry in "${projects[@]}"; do
    read -r project_name project_file <<<"$entry"
    down "$project_name" "$project_file" \
      || { say "warning: teardown of $project_name failed:" >&2; tail -5 "$work/down.log" >&2; }
  done
  rm -rf "$work"
  exit "$code"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# containers PROJECT: one line per container: service status exit-code name
containers() {
  local ids
  ids=$("$engine" ps -aq --filter "label=com.docker.compose.project=$1")
  [ -n "$ids" ] || return 0
  # shellcheck disable=SC2086  # one argument per id
  "$engine" inspect --format \
    '{{index .Config.Labels "com.docker.compose.service"}} {{.State.Status}} {{.State.ExitCode}} {{.Name}}' \
    $ids | sed 's# /# #' | sort
}
show_logs() {  # show_logs PROJECT: the last lines of every container's log
  local service status code name
  while read -r service status code name; do
    echo "---- $name ($service, $status, exit $code)"
    "$engine" logs "$name" 2>&1 | tail -25
  done < <(containers "$1")
}

published() {  # published PORT [COMPOSE_ARGS...]: the host address of a container port
  # docker compose prints HOST:PORT, podman-compose only the port; the compose files
  # publish on the host's loopback either way.
  local port
  port=$(timeout 30 "${compose[@]}" "${@:2}" port sampler "$1" 2>/dev/null \
           | grep -Eo '[0-9]+$' | tail -1)
  [ -n "$port" ] && echo "127.0.0.1:$port"
}

say "${compose[*]} ($engine $engine_version); $FEEDMUX_FILES files x $FEEDMUX_EXAMPLES examples," \
    "$FEEDMUX_EPOCHS epochs, $FEEDMUX_TRAINERS trainers, $FEEDMUX_WORKERS sampling worker(s)"

# -- 1. build -------------------------------------------------------------------------------
t=$SECONDS
projects+=("$project")
if ! timeout "$build_timeout" "${compose[@]}" -p "$project" build >"$work/build.log" 2>&1; then
  tail -30 "$work/build.log" >&2
  die "build (bounded by ${build_timeout} s)"
fi
build_s=$((SECONDS - t))
say "build: ok (${build_s} s)"

# -- 2. compose up: sampler, trainers, checker ----------------------------------------------
t=$SECONDS
deadline=$((SECONDS + run_timeout))
if ! timeout "$run_timeout" "${compose[@]}" -p "$project" up -d --no-build >"$work/up.log" 2>&1; then
  tail -30 "$work/up.log" >&2
  show_logs "$project" >&2
  die "compose up"
fi
expected=$((FEEDMUX_TRAINERS + 2))
while :; do
  states=$(containers "$project")
  running=$(awk '$2 !~ /^(exited|dead|stopped)$/' <<<"$states" | wc -l)
  total=$(wc -l <<<"$states")
  [ "$total" -ge "$expected" ] && [ "$running" -eq 0 ] && break
  # A failed sampler or trainer means the checker would only wait for records in vain.
  if awk '($1 == "sampler" || $1 == "trainer") && $2 ~ /^(exited|dead)$/ && $3 != 0 {bad = 1}
          END {exit !bad}' <<<"$states"; then
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    show_logs "$project" >&2
    die "the containers did not finish within ${run_timeout} s:"$'\n'"$states"
  fi
  sleep 1
done
run_s=$((SECONDS - t))

states=$(containers "$project")
report=$(awk '{printf "%s%s %s (exit %s)", sep, $4, $2, $3; sep = ", "}' <<<"$states")
trainers_ok=$(awk '$1 == "trainer" && $2 == "exited" && $3 == 0' <<<"$states" | wc -l)
sampler_ok=$(awk '$1 == "sampler" && $2 == "exited" && $3 == 0' <<<"$states" | wc -l)
checker=$(awk '$1 == "checker" {print $4}' <<<"$states")
verdict=""
if [ -n "$checker" ]; then
  verdict=$("$engine" logs "$checker" 2>&1 || true)
fi
if [ "$sampler_ok" -ne 1 ] || [ "$trainers_ok" -ne "$FEEDMUX_TRAINERS" ] \
   || ! awk '$1 == "checker" && $2 == "exited" && $3 == 0 {ok = 1} END {exit !ok}' <<<"$states" \
   || ! grep -q '^OK: ' <<<"$verdict"; then
  show_logs "$project" >&2
  die "compose run: $report"
fi
say "compose run: ok (${run_s} s): $report"
while read -r service status code name; do
  if [ "$service" = trainer ]; then
    "$engine" logs "$name" 2>&1 | grep '^trainer ' | sed 's/^/  /' || true
  fi
done <<<"$states"
# shellcheck disable=SC2001  # indent every line
sed 's/^/  /' <<<"$verdict"
down "$project"

# -- 3. a trainer on the host, against the published ports ----------------------------------
host_python=${FEEDMUX_HOST_PYTHON:-}
if [ -z "$host_python" ]; then
  for candidate in .venv/bin/python python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import feedmux' 2>/dev/null; then
      host_python=$candidate
      break
    fi
  done
fi
if [ -z "$host_python" ]; then
  host_result="skipped (no Python with feedmux on the host; set FEEDMUX_HOST_PYTHON)"
  say "host trainer: $host_result"
else
  t=$SECONDS
  projects+=("$host_project")
  if ! FEEDMUX_EPOCHS=1 FEEDMUX_TRAINERS=1 timeout 120 "${compose[@]}" -p "$host_project" \
       up -d --no-build sampler \
       >"$work/up-host.log" 2>&1; then
    tail -30 "$work/up-host.log" >&2
    die "compose up sampler (for the host trainer)"
  fi
  data_host="" control_host="" answered=0
  for _ in $(seq 60); do
    if [ -z "$control_host" ]; then  # known once the container runs
      data_host=$(published 5555 -p "$host_project") || true
      control_host=$(published 5556 -p "$host_project") || true
    fi
    if [ -n "$control_host" ] && [ -n "$data_host" ] \
       && "$host_python" -m feedmux ping "tcp://$control_host" --timeout 1 >"$work/ping.log" 2>&1; then
      answered=1
      break
    fi
    sleep 1
  done
  control="tcp://${control_host:-?}"
  if [ "$answered" -ne 1 ]; then
    cat "$work/ping.log" >&2 || true
    show_logs "$host_project" >&2
    die "the sampler's published control port $control did not answer within 60 s"
  fi
  mkdir "$work/host-results"
  if ! timeout 120 "$host_python" -m feedmux.apps.demo trainer "tcp://$data_host" \
         --control "$control" --results "$work/host-results" --timeout 60 \
         >"$work/host-trainer.log" 2>&1 \
     || ! "$host_python" -m feedmux.apps.demo check "$work/host-results" --files "$FEEDMUX_FILES" \
         --examples "$FEEDMUX_EXAMPLES" --epochs 1 --trainers 1 --wait 5 >"$work/host-check.log" 2>&1; then
    cat "$work/host-trainer.log" "$work/host-check.log" >&2 2>/dev/null || true
    show_logs "$host_project" >&2
    die "host trainer against tcp://$data_host"
  fi
  host_s=$((SECONDS - t))
  host_result="ok (${host_s} s): $(grep '^OK: ' "$work/host-check.log")"
  say "host trainer via the published ports $data_host and $control_host: $host_result"
  down "$host_project"
fi

# -- 4. the template for one's own sampler, with a trainer on the host through the pool ------
if [ -z "$host_python" ]; then
  template_result="skipped (no Python with feedmux on the host; set FEEDMUX_HOST_PYTHON)"
  say "template: $template_result"
else
  t=$SECONDS
  projects+=("$template_project $template_file")
  template=(-f "$template_file" -p "$template_project")
  # podman-compose (1.6 and older) ignores a service's ipc: without a word; the
  # template's docs say to pass it this way.
  if [ "$engine" = podman ]; then
    template+=(--podman-run-args=--ipc=host)
  fi
  # The sampler runs as the feedmux image's uid 10001 (the template's default); a trainer
  # that is neither root nor that uid needs the sampler to run as itself to open the pool.
  if [ "$(id -u)" != 0 ]; then
    FEEDMUX_USER="$(id -u):$(id -g)"
    export FEEDMUX_USER
  fi
  if ! timeout "$build_timeout" "${compose[@]}" "${template[@]}" build \
       >"$work/template-build.log" 2>&1; then
    tail -30 "$work/template-build.log" >&2
    die "template build (FROM the image of step 1)"
  fi
  # Example images, world-readable, written by the template image's Pillow.
  mkdir "$work/images"
  if ! timeout 120 "$engine" run --rm --user 0 --entrypoint python \
       -v "$PWD/examples/container/make_images.py:/make_images.py:ro" -v "$work/images:/out" \
       my-sampler:latest /make_images.py /out >"$work/template-images.log" 2>&1; then
    cat "$work/template-images.log" >&2
    die "template: writing the example images"
  fi
  if ! FEEDMUX_DATA="$work/images" timeout 120 "${compose[@]}" "${template[@]}" up -d --no-build \
       >"$work/template-up.log" 2>&1; then
    tail -30 "$work/template-up.log" >&2
    die "template: compose up"
  fi
  data_host="" control_host="" answered=0
  for _ in $(seq 60); do
    if [ -z "$control_host" ]; then
      data_host=$(published 5555 "${template[@]}") || true
      control_host=$(published 5556 "${template[@]}") || true
    fi
    if [ -n "$control_host" ] && [ -n "$data_host" ] \
       && "$host_python" -m feedmux ping "tcp://$control_host" --timeout 1 >"$work/ping.log" 2>&1; then
      answered=1
      break
    fi
    sleep 1
  done
  if [ "$answered" -ne 1 ]; then
    cat "$work/ping.log" >&2 || true
    show_logs "$template_project" >&2
    die "the template's sampler did not answer on tcp://${control_host:-?} within 60 s"
  fi
  if ! PYTHONPATH="$PWD/examples/container${PYTHONPATH:+:$PYTHONPATH}" timeout 120 \
       "$host_python" - "tcp://$data_host" "tcp://$control_host" "$work/images" \
       >"$work/template-trainer.log" 2>&1 <<'PYTHON'
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from feedmux import RemoteLoader, fetch_stats

data, control, folder = sys.argv[1:]
names = sorted(f"{path.parent.name}/{path.name}" for path in Path(folder).glob("*/*.png"))
pulled, held = [], []
with RemoteLoader(data, control=control, timeout=60) as loader:
    for sample in loader:
        name, label = str(sample["name"]), int(sample["label"])
        image, index = sample["image"], int(name[-8:-4])
        assert image.shape == (320, 320, 3) and image.dtype == np.uint8, (name, image.shape)
        assert (image[..., 0] == index).all() and (image[..., 1] == label).all(), name
        pulled.append(name)
        if len(held) < 4:
            held.append((name, index, label, image))
        if len(pulled) == 2 * len(names):
            break
    shm_messages = fetch_stats(control)["shm_messages"]
for epoch in range(2):
    counts = Counter(pulled[epoch * len(names):(epoch + 1) * len(names)])
    assert counts == Counter(names), f"epoch {epoch}: {counts}"
changed = [name for name, index, label, image in held
           if not ((image[..., 0] == index).all() and (image[..., 1] == label).all())]
assert not changed, f"arrays changed while held: {changed}"
assert shm_messages > 0, "no message went through the shared-memory pool"
print(f"OK: 2 epochs of {len(names)} images, every image once an epoch; "
      f"{shm_messages} messages through the shared-memory pool; held arrays unchanged")
PYTHON
  then
    cat "$work/template-trainer.log" >&2
    show_logs "$template_project" >&2
    die "template: host trainer against tcp://$data_host"
  fi
  template_s=$((SECONDS - t))
  template_result="ok (${template_s} s): $(grep '^OK: ' "$work/template-trainer.log")"
  say "template (examples/container) with a trainer on the host: $template_result"
  down "$template_project" "$template_file"
fi

# -- summary ----------------------------------------------------------------------------------
cat <<EOF

== container test summary (${compose[*]}, $engine $engine_version) ==
build:         ok, ${build_s} s
compose run:   ok, ${run_s} s: sampler + $FEEDMUX_TRAINERS trainers + checker all exited 0
               $(grep '^OK: ' <<<"$verdict")
host trainer:  $host_result
template:      $template_result
PASS in $((SECONDS - started)) s (teardown follows)
EOF
