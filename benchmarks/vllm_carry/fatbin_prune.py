"""Shrink a CUDA extension to the GPU code one architecture runs (used by build.sh).

Walks the ELF file's ``.nv_fatbin`` section (containers of per-architecture entries: machine
code images and PTX) and keeps, per container, the machine code for ``keep_sm``; where there is
none, the newest PTX not newer than ``keep_sm`` (the driver compiles it), else the smallest entry.
Dropped entries are zero-filled in place, so every offset in the file stays valid, and the
zeros compress to nothing. ``python fatbin_prune.py LIB.so`` lists the entries by kind and size.
"""
import struct, sys, collections
def sections(path):
    data = open(path,'rb').read()
    # parse ELF64 section headers
    e_shoff, = struct.unpack_from('<Q', data, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from('<HHH', data, 0x3A)
    shs = []
    for i in range(e_shnum):
        off = e_shoff + i*e_shentsize
        name, typ, flags, addr, offset, size = struct.unpack_from('<IIQQQQ', data, off)
        shs.append((name, offset, size))
    stroff = shs[e_shstrndx][1]
    out = {}
    for name, offset, size in shs:
        n = data[stroff+name: data.index(b'\0', stroff+name)].decode()
        out[n] = (offset, size)
    return data, out
def entries(data, off, size):
    end = off + size
    p = off
    while p < end:
        magic, ver, hsz, fsz = struct.unpack_from('<IHHQ', data, p)
        if magic != 0xBA55ED50:
            # padding
            p += 8; continue
        q = p + hsz
        cend = q + fsz
        while q < cend:
            kind, ever, ehsz, padded, u0, payload, u1, u2, sm, bits, u3, flags, u5, uncompressed = struct.unpack_from('<HHIIIIIIIIIQQQ', data, q)
            yield dict(container=p, entry=q, kind=kind, hsz=ehsz, padded=padded, payload=payload, sm=sm, flags=flags, uncompressed=uncompressed, data_off=q+ehsz)
            q += ehsz + padded
        p = cend
def prune(src, dst, keep_sm=(90,)):
    data, secs = sections(src)
    buf = bytearray(data)
    off, size = secs['.nv_fatbin']
    end = off + size
    p = off
    before = after = 0
    while p < end:
        magic, ver, hsz, fsz = struct.unpack_from('<IHHQ', data, p)
        if magic != 0xBA55ED50:
            p += 8; continue
        q = p + hsz; cend = q + fsz
        ents = []
        while q < cend:
            kind, ever, ehsz, padded = struct.unpack_from('<HHII', data, q)
            sm, = struct.unpack_from('<I', data, q + 28)
            ents.append((kind, sm, q, ehsz + padded))
            q += ehsz + padded
        has_elf = any(k == 2 and sm in keep_sm for k, sm, _, _ in ents)
        keep = [e for e in ents if e[0] == 2 and e[1] in keep_sm]
        if not has_elf:
            ptx = [e for e in ents if e[0] == 1 and e[1] <= max(keep_sm)]
            if ptx:
                best = max(e[1] for e in ptx)
                keep = [e for e in ptx if e[1] == best]
            else:
                keep = [min(ents, key=lambda e: e[3])]  # nothing runs on keep_sm: keep one small image
        chunks = b''.join(data[s:s+l] for _, _, s, l in keep)
        before += fsz; after += len(chunks)
        body_start = p + hsz
        buf[body_start:cend] = chunks + bytes(cend - body_start - len(chunks))
        struct.pack_into('<Q', buf, p + 8, len(chunks))
        p = cend
    open(dst, 'wb').write(buf)
    return before, after


if __name__ == '__main__':
    data, secs = sections(sys.argv[1])
    off, size = secs['.nv_fatbin']
    c = collections.Counter(); n = collections.Counter()
    for e in entries(data, off, size):
        k = ('PTX' if e['kind']==1 else 'ELF' if e['kind']==2 else e['kind'], e['sm'], hex(e['flags']))
        c[k] += e['padded']; n[k] += 1
    for k in sorted(c, key=lambda k: -c[k]): print(k, n[k], c[k])
    print('total', sum(c.values()), 'section', size)
