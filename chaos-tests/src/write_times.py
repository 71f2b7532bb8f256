# See chaos_tests::WRITE_TIMES.
import os, sys, time
path, size, sleep_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
control = sys.argv[4] if len(sys.argv) > 4 else None
write_back = len(sys.argv) > 5 and sys.argv[5] == "write-back"
fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
data = bytes((i * 7 + 1) % 251 for i in range(size))
before = time.time_ns()
assert os.write(fd, data) == size
after = time.time_ns()
if write_back:
    # The pages, not the inode's times: sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER).
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    assert libc.sync_file_range(fd, 0, 0, 7) == 0, os.strerror(ctypes.get_errno())
if control:
    open(os.path.join(control, "written"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(control, "resume")):
        assert time.monotonic() < deadline, "never resumed"
        time.sleep(0.01)
time.sleep(sleep_s)
open_st = os.fstat(fd)
closing = time.time_ns()
os.close(fd)
st = os.stat(path)
print("write_from=%d write_to=%d close=%d open_mtime=%d open_ctime=%d mtime=%d ctime=%d" % (
    before, after, closing, open_st.st_mtime_ns, open_st.st_ctime_ns, st.st_mtime_ns, st.st_ctime_ns))
