#!/usr/bin/env python3
"""Client-plane frames an SDK test sent and received, from an strace log.

    strace -f -qq -Y -e trace=sendto,recvfrom,connect,close -xx -s 65536 -o /tmp/sdk.strace \
        sdk-tests/target/debug/deps/smoke-HASH          # with STRAND_BIN set
    python3 sdk-tests/wire-trace.py /tmp/sdk.strace

Only the test process's own threads are read (strace -Y names them; the strand nodes are
other commands), HTTP exchanges with /metrics are skipped, and each socket's bytes are cut
into frames by the header's size field (client-plane.md section 1). One line per frame:
requests with operation, legacy code, request number, session, size and body; replies with
command, operation, status (or the eviction reason) and body.
"""

import re
import struct
import sys

# Thread names of the test process: the test harness's threads and tokio's workers.
SDK_THREADS = re.compile(r"^(smoke|backup|probe|failover|tokio-rt-worker|sdk_).*")

LINE = re.compile(r"^(\d+)<([^>]*)> (.*)$")
RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
IO = re.compile(r'^(sendto|recvfrom)\((\d+), "((?:\\x[0-9a-f]{2})*)".*\)\s*=\s*(-?\d+)')
OPEN_CLOSE = re.compile(r"^(connect|close)\((\d+)")


def unescape(name):
    return bytes.fromhex(name.replace("\\x", "")).decode(errors="replace") if "\\x" in name else name


def syscalls(path):
    pending = {}
    for line in open(path, encoding="utf-8", errors="replace"):
        m = LINE.match(line.rstrip("\n"))
        if not m:
            continue
        tid, comm, rest = m.groups()
        if not SDK_THREADS.match(unescape(comm)):
            continue
        if rest.endswith("<unfinished ...>"):
            pending[tid] = rest[: -len("<unfinished ...>")]
            continue
        r = RESUMED.match(rest)
        if r:
            rest = pending.pop(tid, "") + r.group(2)
        oc = OPEN_CLOSE.match(rest)
        if oc:
            yield ("reset", int(oc.group(2)), b"")
            continue
        io = IO.match(rest)
        if io and int(io.group(4)) > 0:
            data = bytes.fromhex(io.group(3).replace("\\x", ""))
            yield (io.group(1), int(io.group(2)), data[: int(io.group(4))])


def connections(path):
    """Per socket lifetime (a reused fd starts afresh): the bytes sent and the bytes received."""
    done, current = [], {}
    for kind, fd, data in syscalls(path):
        if kind == "reset":
            if fd in current:
                done.append((fd, current.pop(fd)))
            continue
        current.setdefault(fd, {"sendto": bytearray(), "recvfrom": bytearray()})[kind].extend(data)
    done.extend(current.items())
    return done


def frames(fd, buf):
    """The frames in `buf`, or none when it does not start with a client-plane header (the
    /metrics exchanges)."""
    out, i = [], 0
    while i + 256 <= len(buf):
        h = buf[i : i + 256]
        size = struct.unpack_from("<I", h, 48)[0]
        if size < 256 or h[60] not in (5, 8, 13):
            if i:
                out.append(f"fd{fd}: no frame header at byte {i} (size {size}, command {h[60]}); rest skipped")
            return out
        body = bytes(buf[i + 256 : i + size])
        if h[60] == 5:
            op, code = h[176], struct.unpack_from("<I", h, 196)[0]
            request, session = struct.unpack_from("<Q", h, 168)[0], struct.unpack_from("<Q", h, 184)[0]
            out.append(f"fd{fd} -> request op={op} code={code} request={request} session={session} size={size} body={body.hex()}")
        elif h[60] == 13:
            out.append(f"fd{fd} <- eviction reason={h[255]}")
        else:
            op, status = h[208], struct.unpack_from("<I", h, 216)[0]
            out.append(f"fd{fd} <- reply op={op} status={status} size={size} body={body.hex()}")
        i += size
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for fd, io in connections(sys.argv[1]):
        sent, received = frames(fd, io["sendto"]), frames(fd, io["recvfrom"])
        # Lockstep: the n-th reply answers the n-th request.
        for n in range(max(len(sent), len(received))):
            for side in (sent, received):
                if n < len(side):
                    print(side[n])


if __name__ == "__main__":
    main()
