#!/usr/bin/env python3
"""Reports C++ files over a line limit and functions over a line limit.

  scripts/sizes.py [--file-lines N] [--function-lines N] DIR...

A function is a brace block whose header has a parameter list and is not a
class, namespace, enum, control statement or lambda; its size is the lines
from the header's first line to the closing brace. Lambdas and local classes
count toward the function they are in. Exit status 1 when anything is over.
"""
import argparse
import pathlib
import re
import sys

CONTROL = re.compile(r"^\s*(if|for|while|switch|else|do|catch|try)\b")
TYPE = re.compile(r"^\s*(template\s*<.*>\s*)?(class|struct|union|namespace|enum)\b")


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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--file-lines", type=int, default=600)
    parser.add_argument("--function-lines", type=int, default=60)
    parser.add_argument("dirs", nargs="+")
    args = parser.parse_args()
    over = []
    for directory in args.dirs:
        for path in sorted(pathlib.Path(directory).rglob("*")):
            if path.suffix not in (".h", ".cc"):
                continue
            lines = len(path.read_text().splitlines())
            if lines > args.file_lines:
                over.append(f"{path}: {lines} lines (limit {args.file_lines})")
            for name, start, size in functions(path):
                if size > args.function_lines:
                    over.append(f"{path}:{start}: {name}: {size} lines (limit {args.function_lines})")
    for line in over:
        print(line)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
