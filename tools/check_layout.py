#!/usr/bin/env python3
"""The host side's trust boundary, checked from the code's own #include lines.

host-daemon/ is laid out by trust (host-daemon/README.md):

  daemon/   ivcudad's trusted side: unsandboxed, never loads the driver
  sandbox/  the jail, applied by the daemon's launcher in a worker's process
  worker/   the sandboxed worker: the driver and the guest's requests
  shared/   what both link, and the two headers that cross between them

What a folder may include of the project is what its trust allows. The
daemon's side reaches the worker only through shared/to_worker.h and reads
what workers write only through shared/from_worker.h; it never sees the
guest's request formats (ivcuda/proto.h, nvml_wire.h), the driver's or NVML's
headers, nor dlopen. The worker never includes the daemon's side or the
sandbox's. shared/ includes only itself.

docs/security.md's section "Which folder holds which rules" lists each
folder's security rules (IVCUDA_RULE ids, the mutation build's switches); the
check also requires that list to be the code's.

Usage: check_layout.py [ROOT]         exit 1 and one line per breach
       check_layout.py --rules [ROOT] prints the section's rows from the code
       check_layout.py --self-test    proves that each rule can fail
"""
import os
import re
import shutil
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
DLOPEN = re.compile(r"\bdlopen\s*\(")

# Folder -> the host-daemon/ folders whose headers it may include.
ALLOWED = {
    "daemon": {"daemon", "sandbox", "shared"},
    "sandbox": {"sandbox", "shared"},
    "worker": {"worker", "shared"},
    "shared": {"shared"},
}
# What the trusted side (daemon/) never includes: the guest's request formats
# and the driver's and NVML's headers. (sandbox/ loads the driver on purpose,
# inside the worker's process, before its jail closes.)
TRUSTED_NEVER = {"ivcuda/proto.h", "ivcuda/nvml_wire.h", "cuda.h", "cudaTypedefs.h", "nvml.h"}


def breaches(root):
    host = os.path.join(root, "host-daemon")
    out = []
    for folder in sorted(ALLOWED):
        base = os.path.join(host, folder)
        if not os.path.isdir(base):
            out.append(f"host-daemon/{folder}/: missing")
            continue
        for dirpath, _, files in os.walk(base):
            for name in sorted(files):
                if not name.endswith((".cc", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m:
                            target = m.group(2)
                            if target.startswith("host-daemon/"):
                                parts = target.split("/")
                                if len(parts) < 3 or parts[1] not in ALLOWED[folder]:
                                    out.append(f"{rel}:{n}: host-daemon/{folder}/ may not include {target}")
                            if folder == "daemon" and target in TRUSTED_NEVER:
                                out.append(f"{rel}:{n}: the daemon's side may not include {target}")
                        elif folder == "daemon" and DLOPEN.search(line) and not line.lstrip().startswith("//"):
                            out.append(f"{rel}:{n}: the daemon's side loads no library (dlopen)")
        # Nothing but the folders above: a new one must say where it stands.
    for entry in sorted(os.listdir(host)):
        if os.path.isdir(os.path.join(host, entry)) and entry not in ALLOWED:
            out.append(f"host-daemon/{entry}/: a folder check_layout.py does not place")
        elif entry.endswith((".cc", ".h")):
            out.append(f"host-daemon/{entry}: code outside the four folders")
    return out


RULE = re.compile(r'IVCUDA_RULE\(\s*"([a-z0-9-]+)"\s*\)')
RULE_DIRS = ("host-daemon", "ring", "include", "guest")
DOC_SECTION = "## Which folder holds which rules"


def rules_by_folder(root):
    """{folder: {rule ids}} from the code (rules.h only defines the macro)."""
    by = {}
    for top in RULE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                path = os.path.join(dirpath, name)
                if not name.endswith((".cc", ".h", ".c")) or path.endswith(os.path.join("shared", "rules.h")):
                    continue
                with open(path, encoding="utf-8") as f:
                    ids = set(RULE.findall(f.read()))
                if ids:
                    by.setdefault(os.path.relpath(dirpath, root) + "/", set()).update(ids)
    return by


def doc_rows(root):
    """{folder: {rule ids}} as docs/security.md's section lists them."""
    with open(os.path.join(root, "docs", "security.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.find(DOC_SECTION)
    if start < 0:
        return None
    end = text.find("\n## ", start + len(DOC_SECTION))
    rows = {}
    for line in text[start:end if end > 0 else len(text)].split("\n"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 2:
            rows[cells[0].strip("`")] = set(re.findall(r"`([a-z0-9-]+)`", cells[-1]))
    return rows


def rule_breaches(root):
    code, doc = rules_by_folder(root), doc_rows(root)
    if doc is None:
        return [f"docs/security.md: no section '{DOC_SECTION}'"]
    out = []
    for folder in sorted(set(code) | set(doc)):
        have, said = code.get(folder, set()), doc.get(folder, set())
        for r in sorted(have - said):
            out.append(f"docs/security.md '{DOC_SECTION}': {folder} holds rule {r}, not listed there")
        for r in sorted(said - have):
            out.append(f"docs/security.md '{DOC_SECTION}': {folder} is said to hold rule {r}, the code has none")
    return out


def self_test():
    # A tree that keeps every rule, then one breach of each kind: each must be caught.
    good = {
        "host-daemon/daemon/a.cc": '#include "host-daemon/shared/to_worker.h"\n#include <cstdio>\n',
        "host-daemon/sandbox/s.cc": '#include "host-daemon/shared/log.h"\n// dlopen( in a comment\n',
        "host-daemon/worker/w.cc": '#include <cuda.h>\n#include "host-daemon/worker/worker.h"\n',
        "host-daemon/shared/x.h": '#include "host-daemon/shared/log.h"\n',
    }
    bad = [
        ("host-daemon/daemon/b.cc", '#include "host-daemon/worker/worker.h"\n'),
        ("host-daemon/daemon/c.cc", "#include <cuda.h>\n"),
        ("host-daemon/daemon/d.cc", '#include "ivcuda/proto.h"\n'),
        ("host-daemon/daemon/e.cc", "  void* h = dlopen(name, RTLD_NOW);\n"),
        ("host-daemon/worker/f.cc", '#include "host-daemon/daemon/fd_broker.h"\n'),
        ("host-daemon/worker/g.cc", '#include "host-daemon/sandbox/sandbox.h"\n'),
        ("host-daemon/shared/h.h", '#include "host-daemon/worker/worker.h"\n'),
        ("host-daemon/sandbox/i.cc", '#include "host-daemon/daemon/launch.h"\n'),
        ("host-daemon/stray.cc", "int x;\n"),
    ]
    failures = 0
    for extra in [None] + bad:
        tmp = tempfile.mkdtemp()
        try:
            files = dict(good)
            if extra:
                files[extra[0]] = extra[1]
            for rel, text in files.items():
                path = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            found = breaches(tmp)
            if extra is None and found:
                print(f"self-test: a tree that keeps the rules was refused: {found}")
                failures += 1
            elif extra is not None and not any(extra[0] in b for b in found):
                print(f"self-test: {extra[0]} ({extra[1].strip()}) was not caught")
                failures += 1
        finally:
            shutil.rmtree(tmp)
    # The rules' list: a rule the code holds but the list lacks, and the reverse.
    tmp = tempfile.mkdtemp()
    try:
        os.makedirs(os.path.join(tmp, "host-daemon", "worker"))
        os.makedirs(os.path.join(tmp, "docs"))
        with open(os.path.join(tmp, "host-daemon", "worker", "w.cc"), "w", encoding="utf-8") as f:
            f.write('if (IVCUDA_RULE("kept-rule") && IVCUDA_RULE("unlisted-rule")) {}\n')
        with open(os.path.join(tmp, "docs", "security.md"), "w", encoding="utf-8") as f:
            f.write(f"{DOC_SECTION}\n\n| folder | rules |\n|---|---|\n"
                    "| `host-daemon/worker/` | `kept-rule`, `gone-rule` |\n")
        found = rule_breaches(tmp)
        for r in ("unlisted-rule", "gone-rule"):
            if not any(r in b for b in found):
                print(f"self-test: the rules' list missed {r}")
                failures += 1
        if any("kept-rule" in b for b in found):
            print("self-test: a listed rule the code holds was refused")
            failures += 1
    finally:
        shutil.rmtree(tmp)
    print(f"check_layout self-test: {len(bad) + 2} breaches, {failures} missed")
    return 1 if failures else 0


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    if args[:1] == ["--rules"]:
        for folder, ids in sorted(rules_by_folder(args[1] if len(args) > 1 else here).items()):
            print(f"| `{folder}` | " + ", ".join(f"`{r}`" for r in sorted(ids)) + " |")
        return 0
    root = args[0] if args else here
    found = breaches(root) + rule_breaches(root)
    for b in found:
        print(b)
    print(f"check_layout: {len(found)} breach(es) of host-daemon's trust boundary")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
