# Which of this machine's CPUs slow each other down (hyperthreads of one core behind a VM's
# flat topology), and how much a thread that spins with sched_yield takes from a computing
# neighbour. The work: the forward pass of bench/submission_path.py's 200-tensor model on one
# thread, pinned to CPU 0; the neighbour pinned to another CPU. Prints ms per forward (median).
import multiprocessing as mp, os, statistics, sys, time


def forward_times(cpu, seconds=1.5):
    os.sched_setaffinity(0, {cpu})
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(100)])
    x = torch.randn(16, 32)
    with torch.no_grad():
        for _ in range(50):
            model(x)
        times, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            s = time.perf_counter(); model(x); times.append(time.perf_counter() - s)
    return statistics.median(times) * 1e3


def neighbour(cpu, kind, stop):
    os.sched_setaffinity(0, {cpu})
    if kind == "busy":
        while not stop.is_set():
            for _ in range(10000):
                pass
    elif kind == "yield":
        while not stop.is_set():
            for _ in range(100):
                os.sched_yield()
    elif kind == "duty":  # 50 us of sched_yield every millisecond, as an idle engine cycle
        while not stop.is_set():
            time.sleep(0.00095)
            end = time.perf_counter() + 50e-6
            while time.perf_counter() < end:
                os.sched_yield()
    elif kind == "compute":
        import torch
        torch.set_num_threads(1)
        a = torch.randn(64, 64)
        while not stop.is_set():
            for _ in range(100):
                a @ a


def with_neighbour(cpu, kind):
    stop = mp.Event()
    p = mp.Process(target=neighbour, args=(cpu, kind, stop))
    p.start()
    time.sleep(0.2)
    try:
        return forward_times(0)
    finally:
        stop.set(); p.join()


if __name__ == "__main__":
    n = os.cpu_count()
    print("alone on cpu 0: %.3f ms" % forward_times(0))
    for kind in ("busy",):
        print("%s neighbour on cpu k: " % kind + " ".join("%d:%.3f" % (k, with_neighbour(k, kind))
                                                        for k in range(1, n)))
    print("alone on cpu 0: %.3f ms" % forward_times(0))
    for k in sorted({1, n // 2}):
        for kind in ("yield", "duty", "compute"):
            print("%s neighbour on cpu %d: %.3f" % (kind, k, with_neighbour(k, kind)))
    print("alone on cpu 0: %.3f ms" % forward_times(0))
