import errno, fcntl, os, select, sys, time
# See chaos_tests::LOCK_PLAN.
paths, n, plan, deadline = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
control = sys.argv[5] if len(sys.argv) > 5 else None
res_r, res_w = os.pipe()
cmds, pids = [], []
for i in range(n):
    cr, cw = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(res_r)
        os.close(cw)
        cmd = os.fdopen(cr)
        def say(word):
            os.write(res_w, ("%d:%s\n" % (i, word)).encode())
        fd = os.open(paths[i % len(paths)], os.O_RDWR)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, i)
        say("held")
        line = cmd.readline().split()
        if line and line[0] == "req":
            say("requesting")
            signal_deadline = max(1, int(deadline))
            import signal
            def on_alarm(signum, frame):
                raise TimeoutError()  # a handler that returns has Python retry
            signal.signal(signal.SIGALRM, on_alarm)
            signal.alarm(signal_deadline)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX, 1, int(line[1]))
                word = "granted"
            except TimeoutError:
                word = "timeout"
            except OSError as e:
                word = {errno.EDEADLK: "EDEADLK", errno.EINTR: "timeout"}.get(e.errno, "errno%d" % e.errno)
            signal.alarm(0)
            say(word)
        os.close(fd)
        os._exit(0)
    os.close(cr)
    cmds.append(cw)
    pids.append(pid)
os.close(res_w)
buf = b""
end = time.monotonic() + deadline + 5
def next_line():
    global buf
    while b"\n" not in buf:
        left = end - time.monotonic()
        if left <= 0 or not select.select([res_r], [], [], left)[0]:
            return None
        chunk = os.read(res_r, 4096)
        if not chunk:
            return None
        buf += chunk
    line, buf = buf.split(b"\n", 1)
    return line.decode()
def expect(word):
    line = next_line()
    assert line is not None and line.endswith(":" + word), (line, word)
    return int(line.split(":")[0])
def sleeping(pid):
    with open("/proc/%d/stat" % pid) as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    with open("/proc/%d/wchan" % pid) as f:
        wchan = f.read().strip()
    return state == "S" and wchan not in ("", "0")
results = {}
for i in range(n):
    expect("held")
# plan: "0>1,1>2,2>0" requests in order; "r1" releases child 1 (no request).
for step in plan.split(","):
    if step.startswith("r"):
        i = int(step[1:])
        os.write(cmds[i], b"release\n")
        continue
    if step == "p":  # pause: say so, go on once told to
        open(os.path.join(control, "paused"), "w").close()
        t = time.monotonic() + deadline
        while not os.path.exists(os.path.join(control, "resume")):
            assert time.monotonic() < t, "never resumed"
            time.sleep(0.01)
        continue
    if step.startswith("w"):  # waits: nobody answered within this many ms
        t = time.monotonic() + int(step[1:]) / 1000
        while time.monotonic() < t:
            if b"\n" in buf or select.select([res_r], [], [], max(0, t - time.monotonic()))[0]:
                line = next_line()
                if line is None:  # every process has answered and exited
                    break
                w, word = line.split(":")
                results[int(w)] = "early-" + word
        continue
    i, target = map(int, step.split(">"))
    os.write(cmds[i], ("req %d\n" % target).encode())
    expect("requesting")
    t = time.monotonic() + deadline
    while not sleeping(pids[i]) and time.monotonic() < t:
        if select.select([res_r], [], [], 0.005)[0]:
            break  # answered already (EDEADLK)
    time.sleep(0.2)
for c in cmds:
    try:
        os.write(c, b"release\n")
    except OSError:
        pass
while len(results) < sum(1 for s in plan.split(",") if ">" in s):
    line = next_line()
    if line is None:
        break
    w, word = line.split(":")
    results[int(w)] = word
for pid in pids:
    os.waitpid(pid, 0)
print(" ".join("%d:%s" % (k, results.get(k, "none")) for k in sorted(results)) or "none")
