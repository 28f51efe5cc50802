#!/usr/bin/env python3
"""Marks shared libraries DT_SYMBOLIC: each binds its references to its own
functions and data to itself, before the process's global scope.

scripts/wheel.sh bundles renamed copies of the libraries libmend.so needs.
A process may hold the system's copy of one of them in its global scope
(Debian's torch under TORCH_USE_RTLD_GLOBAL=1 brings libgloo, libibverbs and
libnl). A bundled copy's calls into itself would then bind to the system
copy: libnl-route's constructors registered its traffic-control modules in
the other copy's list, and the process crashed at exit. DT_SYMBOLIC keeps
each copy to itself. wheel.sh applies it to the bundled libraries written in
C (no C++ symbol exported), where binding to oneself cannot split a C++
entity that must be one across libraries.

patchelf 0.14 cannot add the tag, so this asks it to add a DT_NEEDED entry
naming MARK (patchelf makes room in the dynamic section) and then rewrites
that entry in place as DT_SYMBOLIC.

  elf_symbolic.py FILE...    (x86-64 ELF shared libraries)
"""
import struct
import subprocess
import sys

DT_NULL, DT_NEEDED, DT_STRTAB, DT_SYMBOLIC = 0, 1, 5, 16
PT_LOAD, PT_DYNAMIC = 1, 2
MARK = "mend-symbolic.so"


def dynamic_entries(data):
    """(file offset, tag, value) of each dynamic entry, and a vaddr -> file offset map."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None:
        raise ValueError("no dynamic section")

    def file_offset(vaddr):
        for start, offset, size in loads:
            if start <= vaddr < start + size:
                return vaddr - start + offset
        raise ValueError(f"address {vaddr:#x} is in no loaded segment")

    entries = []
    for offset in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, offset)
        if tag == DT_NULL:
            break
        entries.append((offset, tag, value))
    return entries, file_offset


def mark_symbolic(path):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    entries, _ = dynamic_entries(data)
    if any(tag == DT_SYMBOLIC for _, tag, _ in entries):
        return
    subprocess.run(["patchelf", "--add-needed", MARK, path], check=True)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    entries, file_offset = dynamic_entries(data)
    strtab = file_offset(next(value for _, tag, value in entries if tag == DT_STRTAB))
    name = MARK.encode() + b"\0"
    for offset, tag, value in entries:
        if tag == DT_NEEDED and data[strtab + value:strtab + value + len(name)] == name:
            struct.pack_into("<qQ", data, offset, DT_SYMBOLIC, 0)
            with open(path, "wb") as f:
                f.write(data)
            return
    raise ValueError(f"patchelf added no DT_NEEDED entry for {MARK}")


if __name__ == "__main__":
    for library in sys.argv[1:]:
        try:
            mark_symbolic(library)
        except (OSError, ValueError, subprocess.CalledProcessError) as error:
            sys.exit(f"elf_symbolic: {library}: {error}")
