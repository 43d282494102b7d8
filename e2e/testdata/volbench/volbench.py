# volbench: sequential write and read (64 MiB, 1 MiB blocks) and random
# 4 KiB reads and synced writes, in each directory given, as JSON. The
# page cache is dropped before every read, so reads reach the disk.
import json, os, random, sys, time

SIZE, BLOCK, PAGE = 64 << 20, 1 << 20, 4096


def drop():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def bench(d):
    p = os.path.join(d, "volbench.dat")
    buf = os.urandom(BLOCK)
    t = time.monotonic()
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    for _ in range(SIZE // BLOCK):
        os.write(fd, buf)
    os.fsync(fd)
    os.close(fd)
    seq_write = SIZE / (time.monotonic() - t) / 1e6
    drop()
    t = time.monotonic()
    fd = os.open(p, os.O_RDONLY)
    while os.read(fd, BLOCK):
        pass
    os.close(fd)
    seq_read = SIZE / (time.monotonic() - t) / 1e6
    drop()
    n = 400
    fd = os.open(p, os.O_RDONLY)
    t = time.monotonic()
    for _ in range(n):
        os.pread(fd, PAGE, random.randrange(SIZE // PAGE) * PAGE)
    rand_read = n / (time.monotonic() - t)
    os.close(fd)
    page = os.urandom(PAGE)
    fd = os.open(p, os.O_WRONLY)
    t = time.monotonic()
    for _ in range(n // 4):
        os.pwrite(fd, page, random.randrange(SIZE // PAGE) * PAGE)
        os.fdatasync(fd)
    rand_write = (n // 4) / (time.monotonic() - t)
    os.close(fd)
    os.unlink(p)
    return {"seq_write": seq_write, "seq_read": seq_read, "rand_read": rand_read, "rand_write": rand_write}


print(json.dumps({d: bench(d) for d in sys.argv[1:]}))
