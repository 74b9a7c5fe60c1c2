"""What the watchdog's waits cost: a round trip of the round collectives with ``MPICluster.complete`` (a loop of
``MPI_Test`` that answers pings and notices a silent rank) against ``request.Wait()`` (what ``complete`` did
before issue 40's watchdog), measured in the same run, alternating, medians of several repeats.

One round trip = the server's control broadcast (``send_command``, 4 int64) and a Gatherv of ``--width``
doubles from every rank: the latency floor of a DMTRL round.  Run it under mpiexec:

    mpiexec -n 2 python bench/bench_waits.py [--trips 2000] [--repeats 7] [--width 64] [--wait spin|sleep]

Prints per mode the median microseconds a round trip and the ratio test-loop / Wait (1.0: no cost).
"""
import argparse
import os
import statistics
import time

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--wait", choices=("spin", "sleep"), default="spin")
    args = parser.parse_args()
    os.environ["HPCMTL_MPI_WAIT"] = args.wait
    from hpcmtl.cluster import MPICluster

    class WaitCluster(MPICluster):
        """The waits before the watchdog: one blocking MPI_Wait (spin) or the same sleeping loop (sleep)."""

        def complete(self, request):
            if not self.sleep_waits:
                request.Wait()
                return
            give_up = time.perf_counter() + 5e-5
            while not request.Test():
                if time.perf_counter() > give_up:
                    time.sleep(1e-4)

    test_loop, plain = MPICluster(), WaitCluster()
    counts = np.full(test_loop.size, args.width, dtype=np.int64)
    counts[0] = 0
    local = np.zeros(0 if test_loop.rank == 0 else args.width)

    def trips(cluster):
        cluster.barrier()
        t = time.perf_counter()
        for _ in range(args.trips):
            if cluster.rank == 0:
                cluster.send_command(1)
            else:
                cluster.receive_command()
            cluster.gatherv(local, counts)
        cluster.barrier()
        return (time.perf_counter() - t) / args.trips * 1e6

    times = {"test loop": [], "Wait": []}
    trips(test_loop)
    trips(plain)                                     # warm both paths up
    for _ in range(args.repeats):                    # alternate: drift of a shared node hits both alike
        times["test loop"].append(trips(test_loop))
        times["Wait"].append(trips(plain))
    if test_loop.rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"P = {test_loop.size}, waits: {args.wait}, {args.trips} round trips x {args.repeats} repeats")
        for k, v in med.items():
            print(f"  {k:10s} {v:8.2f} us a round trip (median)")
        print(f"  ratio test loop / Wait: {med['test loop'] / med['Wait']:.3f}")


if __name__ == "__main__":
    main()
