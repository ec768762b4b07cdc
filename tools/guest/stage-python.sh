# shellcheck shell=bash
# Sourced by the test scripts that run Python tools in the test guest, which
# has no Python: this machine's python3 goes in with only the standard-library
# modules the tools load, and the tools' packages from wheels (nothing is
# installed here or fetched).
#
#   python_unpack PY STAGE PACKAGE...
#       unpacks each wheel (.whl) into STAGE/site (with PY's zipfile); from
#       an sdist (.tar.gz, e.g. gpustat-1.1.1.tar.gz) its package folder of
#       the same name
#   stage_python PY STAGE GUEST_SITE [PROBE]...
#       runs each PROBE here with PY -S and PYTHONPATH=STAGE/site, in the
#       caller's environment (give it what the tools need, e.g. an NVML to
#       talk to), and records the modules it had loaded when it exited,
#       whatever its exit status. A PROBE is "-m MODULE [ARG]...",
#       "-c CODE" or "SCRIPT [ARG]..." (words split on blanks, except CODE).
#       Then sets the caller's array python_adds to the --add/--add-bin
#       arguments (build-guest-image.sh, bundle-image.sh unpack) that put into
#       the image: PY as $prefix/bin/python3 (/usr/bin/python3 for a distro's
#       python3), where it finds its standard library as here; the loaded
#       standard-library files at their paths here, with their compiled
#       __pycache__ files (timestamps kept, so the guest does not compile them
#       again under TCG); each loaded extension module with the libraries it
#       needs; STAGE/site as GUEST_SITE. Also sets python_guest, the guest's
#       path of the interpreter. In the guest:
#           PYTHONPATH=GUEST_SITE python3 -S -m TOOL
#       Failing probes are reported on stderr; the exit status is 1 only when
#       PY or STAGE is unusable.

python_unpack() {
	local py=$1 stage=$2 p name tmp
	shift 2
	mkdir -p "$stage/site"
	for p in "$@"; do
		case $p in
		*.whl) "$py" -m zipfile -e "$p" "$stage/site" >/dev/null || return 1 ;;
		*.tar.gz)
			name=$(basename "$p" .tar.gz)
			tmp=$(mktemp -d "${TMPDIR:-/tmp}/stage-python.XXXXXX")
			if ! tar xzf "$p" -C "$tmp" "$name/${name%-*}"; then
				rm -rf "$tmp"
				return 1
			fi
			rm -rf "${stage:?}/site/${name%-*}"
			cp -r "$tmp/$name/${name%-*}" "$stage/site/"
			rm -rf "$tmp"
			;;
		*) echo "stage-python: $p is neither a wheel nor an sdist" >&2; return 1 ;;
		esac
	done
}

stage_python() {
	local py=$1 stage=$2 guest_site=$3
	shift 3
	[[ -x $py ]] || { echo "stage-python: no interpreter $py" >&2; return 1; }
	[[ -d $stage/site ]] || mkdir -p "$stage/site"
	py=$(readlink -f "$py")
	local prefix stdlib trace=$stage/loaded probe rc
	prefix=$("$py" -S -c 'import sys; print(sys.prefix)') &&
		stdlib=$("$py" -S -c 'import os; print(os.path.dirname(os.__file__))') || return 1
	# The tracer: runs the probe as python3 -S would, then, at exit (SystemExit
	# included), writes every loaded module's file.
	cat >"$stage/trace.py" <<'PY'
import atexit, os, runpy, sys
out = sys.argv[1]
def record():
    with open(out, "a") as f:
        for m in list(sys.modules.values()):
            p = getattr(m, "__file__", None)
            if isinstance(p, str):
                f.write(os.path.abspath(p) + "\n")
atexit.register(record)
import encodings.ascii, encodings.latin_1, encodings.utf_8  # the guest has no locale: whichever it picks
kind, args = sys.argv[2], sys.argv[3:]
if kind == "-m":
    sys.argv = [args[0]] + args[1:]
    sys.path[0] = os.getcwd()
    runpy.run_module(args[0], run_name="__main__", alter_sys=True)
elif kind == "-c":
    sys.argv = ["-c"]
    sys.path[0] = ""
    exec(compile(args[0], "<probe>", "exec"), {"__name__": "__main__"})
else:
    sys.argv = [kind] + args
    sys.path[0] = os.path.dirname(os.path.abspath(kind))
    runpy.run_path(kind, run_name="__main__")
PY
	rm -f "$trace"
	for probe in "$@"; do
		rc=0
		if [[ $probe == "-c "* ]]; then
			PYTHONPATH=$stage/site "$py" -S "$stage/trace.py" "$trace" -c "${probe#-c }" </dev/null \
				>"$stage/probe.out" 2>&1 || rc=$?
		else
			# shellcheck disable=SC2086 # a probe's words split on purpose
			PYTHONPATH=$stage/site "$py" -S "$stage/trace.py" "$trace" $probe </dev/null >"$stage/probe.out" 2>&1 || rc=$?
		fi
		if [[ $rc -ne 0 ]]; then
			echo "stage-python: probe '$probe' exited $rc (its modules are staged all the same):" >&2
			tail -5 "$stage/probe.out" >&2
		fi
	done
	# The standard library's loaded files (os.py always: the interpreter finds its prefix by it),
	# each with its compiled form where there is one; extension modules with their libraries.
	local root=$stage/root f
	rm -rf "$root"
	mkdir -p "$root$stdlib/lib-dynload"
	python_adds=(--add-bin "$py:$prefix/bin/python3")
	# shellcheck disable=SC2034 # the caller's
	python_guest=$prefix/bin/python3
	while read -r f; do
		mkdir -p "$root${f%/*}"
		cp -p "$f" "$root$f"
		if [[ $f == *.so ]]; then python_adds+=(--add-bin "$f:$f"); fi
	done < <({ echo "$stdlib/os.py"; cat "$trace" 2>/dev/null; } | "$py" -S -c '
import importlib.util, os, sys
stdlib = sys.argv[1]
for f in sorted({l.strip() for l in sys.stdin}):
    if not f.startswith(stdlib + "/") or not os.path.isfile(f) or "/site-packages/" in f or "/dist-packages/" in f:
        continue
    print(f)
    if f.endswith(".py"):
        c = importlib.util.cache_from_source(f)
        if os.path.isfile(c):
            print(c)' "$stdlib")
	# The packages' loaded modules compiled here (PYTHONDONTWRITEBYTECODE or not);
	# their extension modules with the libraries they need.
	sort -u "$trace" 2>/dev/null | grep -F "$stage/site/" | grep '\.py$' |
		"$py" -S -c 'import py_compile, sys
for f in sys.stdin:
    py_compile.compile(f.strip(), doraise=False)' || true
	while read -r f; do
		python_adds+=(--add-bin "$f:$guest_site/${f#"$stage/site/"}")
	done < <(sort -u "$trace" 2>/dev/null | grep -F "$stage/site/" | grep '\.so$')
	python_adds+=(--add "$root$stdlib:$stdlib" --add "$stage/site:$guest_site")
	echo "stage-python: $py, $(find "$root" -type f -name '*.py' | wc -l) standard modules loaded by $# probe(s)," \
		"site $(du -sk "$stage/site" | cut -f1) KiB" >&2
}
