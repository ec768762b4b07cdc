#!/usr/bin/env python3
"""Refuses test code that cannot fail (tools/test.sh runs it first; tests/lint checks it).

    lint_tests.py [PATH...]      default: every tests/**/*.sh, *.cc and *.h of the tree

Shell scripts (those that source tests/lib/verdicts.sh, and any that makes its own verdicts):
  status-after-substitution  `verdict "... $(cmd)" $?`: the substitution runs last, so `$?` is
                             its status, never the judged program's. Take `rc=$?` on the
                             program's own line and pass $rc.
  literal-status             `verdict NAME 0`: a case that cannot fail (or cannot pass). A thing
                             recorded but not judged is not a case.
  own-verdicts               a script with a verdict() of its own: it has no expected count and no
                             skip rule; use tests/lib/verdicts.sh.
  no-expected-count          a verdicts.sh script without expect_cases: a case that never reports
                             goes unnoticed.
  no-finish                  a verdicts.sh script without finish: nothing checks the count.
  literal-count-with-loops   expect_cases with a bare number where cases are made in a loop: the
                             number does not follow the loop's list; derive it from the list
                             (${#list[@]}). Where no loop makes cases, a number is the script's
                             own line count of cases, which finish checks on every run.
C and C++ (tests/):
  own-skip-rule              getenv("IVCUDA_ALLOW_SKIPS") outside tests/skip.h: skips are allowed
                             only for the value 1; IVCUDA_SKIP and ivcuda_skips_allowed() say so.

The shell is read by a small tokenizer (quotes, $(...), ${...}, here-documents, comments,
command positions, loops and function bodies), enough for this tree's scripts, not all of bash.
Exit status: 0 when nothing was found, 1 otherwise (one line per finding: FILE:LINE: rule: why).
"""
import pathlib
import re
import sys

CASE_WORDS = {"verdict", "not_run", "judge"}
# Words after which the next word is a command again.
KEYWORDS = {"then", "do", "else", "elif", "if", "while", "until", "!", "{", "time"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
HEREDOC = re.compile(r"^<<-?(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1$")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SOURCES_VERDICTS = re.compile(r"^\s*(\.|source)\s+.*lib/verdicts\.sh")


def skip_balanced(s, i, open_ch, close_ch):
    """Index just past the close_ch matching s[i] == open_ch, minding quotes."""
    depth = 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and open_ch != "{":
            j = s.find("'", i + 1)
            i = len(s) if j < 0 else j + 1
            continue
        if c == '"':
            i = skip_double(s, i)
            continue
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def skip_double(s, i):
    """Index just past the double-quoted string starting at s[i]."""
    i += 1
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1
        elif s.startswith("$(", i):
            i = skip_balanced(s, i + 1, "(", ")")
        elif c == "`":
            j = s.find("`", i + 1)
            i = len(s) if j < 0 else j + 1
        else:
            i += 1
    return i


def tokens(line):
    """The line's words and operators, comments dropped: [(text, is_operator)]."""
    out, i, n = [], 0, len(line)

    def standalone(k):  # a { or } that is a word of its own (a group), not part of ${x} or a}b
        return (k == 0 or line[k - 1] in " \t;") and (k + 1 == n or line[k + 1] in " \t;")

    while i < n:
        c = line[i]
        if c in " \t":
            i += 1
            continue
        if c == "#":
            break
        if line.startswith(("&&", "||", ";;"), i):
            out.append((line[i:i + 2], True))
            i += 2
            continue
        if (c in ";|()" or (c == "&" and not line.startswith("&>", i))) or (c in "{}" and standalone(i)):
            out.append((c, True))
            i += 1
            continue
        start = i
        while i < n and line[i] not in " \t;&|()":
            ch = line[i]
            if ch == "\\":
                i += 2
            elif ch == "'":
                j = line.find("'", i + 1)
                i = n if j < 0 else j + 1
            elif ch == '"':
                i = skip_double(line, i)
            elif line.startswith("$(", i):
                i = skip_balanced(line, i + 1, "(", ")")
            elif line.startswith("${", i):
                i = skip_balanced(line, i + 1, "{", "}")
            elif ch == "`":
                j = line.find("`", i + 1)
                i = n if j < 0 else j + 1
            elif ch in "<>" and i + 1 < n and line[i + 1] == "(":  # process substitution
                i = skip_balanced(line, i + 1, "(", ")")
            elif ch in "<>" and i + 1 < n and line[i + 1] == "&":  # 2>&1, <&3
                i += 2
            elif ch == "&" and i + 1 < n and line[i + 1] == ">":  # &>FILE
                i += 2
            elif ch == "=" and i + 1 < n and line[i + 1] == "(" and ASSIGNMENT.match(line[start:i + 1]):
                i = skip_balanced(line, i + 1, "(", ")")  # an array assignment is one word
            else:
                i += 1
        if i < n and line[i] == "&" and i + 1 < n and line[i + 1] == ">":
            i += 2
            while i < n and line[i] not in " \t;|()":
                i += 1
        out.append((line[start:i], False))
    return out


def logical_lines(text):
    """(line number, text) with continuations joined and here-document bodies left out."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        number, cur = i + 1, lines[i]
        while cur.endswith("\\") and i + 1 < len(lines):
            i += 1
            cur = cur[:-1] + " " + lines[i].lstrip()
        i += 1
        yield number, cur
        for word, op in tokens(cur):
            m = HEREDOC.match(word) if not op and not word.startswith("<<<") else None
            if m is None:
                continue
            while i < len(lines) and lines[i].strip() != m.group(2):
                i += 1
            i += 1


class Script:
    """What the lint needs of a script: commands in command position, their loop depth,
    the function each is in, and each command's raw words."""

    def __init__(self, text):
        self.commands = []  # (line, word, args, loop depth, function or None)
        self.functions = {}  # name -> set of command words in its body
        loop_depth, pending_loops = 0, 0
        func, func_brace, brace = None, 0, 0
        pending_func = None
        for number, line in logical_lines(text):
            toks = tokens(line)
            at_command = True
            k = 0
            while k < len(toks):
                text_, op = toks[k]
                if op:
                    if text_ == "{":
                        brace += 1
                        if pending_func is not None:
                            func, func_brace, pending_func = pending_func, brace, None
                            self.functions.setdefault(func, set())
                    elif text_ == "}":
                        if func is not None and brace == func_brace:
                            func = None
                        brace -= 1
                    elif text_ == "(" and k + 1 < len(toks) and toks[k + 1] == (")", True) and k > 0 \
                            and not toks[k - 1][1] and NAME.match(toks[k - 1][0]):
                        pending_func = toks[k - 1][0]  # NAME() {: NAME was taken for a command
                        if self.commands and self.commands[-1][1] == pending_func:
                            self.commands.pop()
                        k += 2
                        continue
                    at_command = True  # after ; && || | & ( ) { } ;; (a case arm's pattern)
                    k += 1
                    continue
                if not at_command:
                    k += 1
                    continue
                word = text_
                if word == "function" and k + 1 < len(toks):
                    pending_func = toks[k + 1][0].rstrip("()")
                    k += 2
                    continue
                if ASSIGNMENT.match(word):
                    k += 1
                    continue
                if word in ("for", "while", "until", "select"):
                    pending_loops += 1
                if word == "do" and pending_loops:
                    pending_loops -= 1
                    loop_depth += 1
                elif word == "done":
                    loop_depth = max(0, loop_depth - 1)
                if word in KEYWORDS or word in ("for", "while", "until", "done", "fi", "esac", "case"):
                    at_command = word in KEYWORDS
                    k += 1
                    continue
                args = []
                j = k + 1
                while j < len(toks) and not toks[j][1]:
                    args.append(toks[j][0])
                    j += 1
                self.commands.append((number, word, args, loop_depth, func))
                if func is not None:
                    self.functions[func].add(word)
                at_command = False
                k = j
        self.case_words = set(CASE_WORDS)
        changed = True
        while changed:
            changed = False
            for name, body in self.functions.items():
                if name not in self.case_words and body & self.case_words:
                    self.case_words.add(name)
                    changed = True


def lint_shell(path, text):
    problems = []
    sources = any(SOURCES_VERDICTS.match(line) for line in text.split("\n"))
    is_library = path.name == "verdicts.sh" and path.parent.name == "lib"
    s = Script(text)
    for number, word, args, _, _ in s.commands:
        if word != "verdict" or not args:
            continue
        status = args[-1].strip('"')
        if status == "$?" and any("$(" in a or "`" in a for a in args[:-1]):
            problems.append((number, "status-after-substitution",
                             "`$?` after a command substitution is the substitution's status; "
                             "take rc=$? on the program's own line"))
        if re.fullmatch(r"-?[0-9]+", status):
            problems.append((number, "literal-status",
                             f"verdict with the literal status {status} cannot fail (or pass): judge what happened"))
    if "verdict" in s.functions and not is_library:
        problems.append((1, "own-verdicts", "a verdict() of its own: source tests/lib/verdicts.sh"))
    if sources and not is_library:
        counts = [(n, args) for n, w, args, _, _ in s.commands if w == "expect_cases"]
        if not counts:
            problems.append((1, "no-expected-count", "sources verdicts.sh but never calls expect_cases"))
        if not any(w == "finish" for _, w, _, _, _ in s.commands):
            problems.append((1, "no-finish", "sources verdicts.sh but never calls finish"))
        looped = [(n, w) for n, w, _, depth, _ in s.commands if depth > 0 and w in s.case_words]
        literal = [(n, a) for n, a in counts if len(a) == 1 and re.fullmatch(r"[0-9]+", a[0].strip('"'))]
        if looped and counts and len(literal) == len(counts):
            n, w = looped[0]
            problems.append((literal[0][0], "literal-count-with-loops",
                             f"expect_cases {literal[0][1][0]} while a loop makes cases ({w}, line {n}): "
                             "derive the count from the loop's list"))
    return problems


def lint_cxx(path, text):
    if path.name == "skip.h" and path.parent.name == "tests":
        return []
    return [(text.count("\n", 0, m.start()) + 1, "own-skip-rule",
             "IVCUDA_ALLOW_SKIPS read here: use IVCUDA_SKIP or ivcuda_skips_allowed() (tests/skip.h)")
            for m in re.finditer(r'getenv\(\s*"IVCUDA_ALLOW_SKIPS"\s*\)', text)]


def files(args, root):
    if args:
        return [pathlib.Path(a) for a in args]
    tests = root / "tests"
    return sorted(p for ext in ("*.sh", "*.cc", "*.h") for p in tests.rglob(ext))


def main(argv):
    root = pathlib.Path(__file__).resolve().parent.parent
    found = 0
    checked = 0
    for path in files(argv[1:], root):
        text = path.read_text(errors="replace")
        checked += 1
        problems = lint_shell(path, text) if path.suffix == ".sh" else lint_cxx(path, text)
        for number, rule, why in problems:
            print(f"{path}:{number}: {rule}: {why}")
            found += 1
    print(f"lint_tests: {checked} files, {found} findings")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
