#!/usr/bin/env python3
"""Reports C++ files over a line limit and functions over a line limit.

  scripts/sizes.py [--file-lines N] [--function-lines N] [--recorded FILE] DIR...

A function is a brace block whose header has a parameter list and is not a
class, namespace, enum, control statement or lambda; its size is the lines
from the header's first line to the closing brace. Lambdas and local classes
count toward the function they are in. Exit status 1 when anything is over.

--recorded FILE names what is over today and may stay so, at most at its
recorded size, until it is split: lines "PATH: LINES" for a file and
"PATH: FUNCTION: LINES" for a function (PATH as given on the command line;
"#" starts a comment). Anything over that is not recorded, or has grown
past its record, fails; so does a record of something now within its
limit, or no longer there (its line must go).
"""
import argparse
import pathlib
import re
import sys

CONTROL = re.compile(r"^\s*(if|for|while|switch|else|do|catch|try)\b")
TYPE = re.compile(r"^\s*(template\s*<.*>\s*)?(class|struct|union|namespace|enum)\b")


def in_number(line, i):
    """Whether line[i] is inside a numeric literal: the token it ends
    begins with a digit."""
    start = i
    while start > 0 and (line[start - 1].isalnum() or line[start - 1] in "_'."):
        start -= 1
    return start < i and line[start].isdigit() and i + 1 < len(line) and line[i + 1].isalnum()


def strip(line, in_comment):
    """The line without comments, strings and character literals."""
    out, i = [], 0
    while i < len(line):
        if in_comment:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i, in_comment = end + 2, False
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            in_comment, i = True, i + 2
        elif line[i] == "'" and in_number(line, i):
            i += 1  # a digit separator (50'000), not a character literal
        elif line[i] in "\"'":
            quote, i = line[i], i + 1
            while i < len(line) and line[i] != quote:
                i += 2 if line[i] == "\\" else 1
            i += 1
        else:
            out.append(line[i])
            i += 1
    return "".join(out), in_comment


def functions(path):
    """(name, first line, lines) of each top-level function definition."""
    found, stack, header, header_start = [], [], "", None
    in_comment = False
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line, in_comment = strip(raw, in_comment)
        if raw.lstrip().startswith("#"):
            continue
        for ch in line:
            if ch == "{":
                text = " ".join(header.split())
                inside_function = any(kind == "function" for kind, _, _ in stack)
                if (not inside_function and "(" in text and not CONTROL.match(text)
                        and not TYPE.match(text) and not text.rstrip().endswith("=")
                        and not re.search(r"\]\s*(\(.*\))?\s*(mutable)?\s*(->.*)?$", text)):
                    words = re.sub(r"\(.*", "", text).split()
                    name = words[-1] if words else "?"  # (a header that opens with "(")
                    stack.append(("function", name, header_start or number))
                else:
                    stack.append(("block", "", number))
                header, header_start = "", None
            elif ch == "}":
                if stack:
                    kind, name, start = stack.pop()
                    if kind == "function":
                        found.append((name, start, number - start + 1))
                header, header_start = "", None
            elif ch == ";":
                header, header_start = "", None
            else:
                if not ch.isspace() and header_start is None:
                    header_start = number
                header += ch
        header += " "
    return found


def read_records(path):
    """{(path, function or None): lines} from a --recorded file."""
    records = {}
    for number, raw in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [field.strip() for field in line.split(": ")]
        if len(fields) not in (2, 3) or not fields[-1].isdigit():
            sys.exit(f"{path}:{number}: '{raw}' is not 'PATH: LINES' or 'PATH: FUNCTION: LINES'")
        records[(fields[0], fields[1] if len(fields) == 3 else None)] = int(fields[-1])
    return records


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--file-lines", type=int, default=600)
    parser.add_argument("--function-lines", type=int, default=60)
    parser.add_argument("--recorded", help="what may stay over, at most at its recorded size")
    parser.add_argument("dirs", nargs="+")
    args = parser.parse_args()
    records = read_records(args.recorded) if args.recorded else {}
    failures, kept, seen = [], [], set()

    def check(key, where, size, limit):
        seen.add(key)
        record = records.get(key)
        if size <= limit:
            if record is not None:
                failures.append(f"{where}: {size} lines, within the limit {limit}: "
                                f"remove its record from {args.recorded}")
        elif record is None:
            failures.append(f"{where}: {size} lines (limit {limit})")
        elif size > record:
            failures.append(f"{where}: {size} lines, grown past its record of {record} "
                            f"(limit {limit})")
        else:
            kept.append(f"{where}: {size} lines (limit {limit}; recorded {record})")

    for directory in args.dirs:
        for path in sorted(pathlib.Path(directory).rglob("*")):
            if path.suffix not in (".h", ".cc"):
                continue
            lines = len(path.read_text().splitlines())
            check((str(path), None), str(path), lines, args.file_lines)
            # By name, the largest of the functions so named (overloads share a record).
            largest = {}
            for name, start, size in functions(path):
                if name not in largest or size > largest[name][1]:
                    largest[name] = (start, size)
            for name, (start, size) in largest.items():
                if size > args.function_lines or (str(path), name) in records:
                    check((str(path), name), f"{path}:{start}: {name}", size, args.function_lines)
    for (path, name), record in sorted(records.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        if (path, name) not in seen and any(path.startswith(d.rstrip("/") + "/") for d in args.dirs):
            failures.append(f"{path}: {name or 'the file'}: recorded in {args.recorded} but not found: "
                            "remove its record")
    for line in kept:
        print(f"recorded: {line}")
    for line in failures:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
