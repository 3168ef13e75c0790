"""Torch-loader-specific behaviour: rank and DataLoader-worker splitting of shards, a worker killed by a stop
signal, a worker's inherited garbage."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import webdataset as wds

from memdpc.pipeline.loader import make_loader
from memdpc.pipeline.torch_loader import split_by_rank

from .test_loader import one_epoch, shard_keys


def test_split_by_rank_matches_wds_split_by_node(monkeypatch):
    urls = [f"s{i}.tar" for i in range(7)]
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        assert list(split_by_rank(urls, rank, 3)) == list(wds.split_by_node(urls))


def test_two_workers_read_each_sample_once(tiny_shards):
    """3 shards, 2 workers: worker 0 reads shards 0 and 2, worker 1 shard 1; partial batches per worker."""
    loader = make_loader(
        tiny_shards, "rgb", "train", train=True, batch_size=3, size=24, backend="torch", num_workers=2
    )
    assert len(loader) == 3  # 4 samples → 2 batches, 2 samples → 1 batch
    assert sorted(one_epoch(loader)) == sorted(shard_keys(tiny_shards, "rgb", "train"))


def test_in_process_loading_matches_workers(tiny_shards):
    kw = dict(train=True, batch_size=2, size=24, backend="torch", seed=4)
    a = one_epoch(make_loader(tiny_shards, "rgb", "train", num_workers=0, **kw))
    b = one_epoch(make_loader(tiny_shards, "rgb", "train", num_workers=1, **kw))
    assert list(a) == list(b) and all((a[k][0] == b[k][0]).all() for k in a)


def test_a_worker_killed_while_a_stop_signal_waits_is_the_interrupt(tiny_shards):
    """A SIGTERM to the process group can kill a worker before its worker_init_fn leaves signals to the main
    process; the loader's error is then the interrupt, not a traceback. Which error depends on what the worker
    was doing: "worker is killed by signal", or a prefetched batch whose shared memory died with it (connection
    reset, EOF). A real loader with a real worker, in a child process that signals itself (the stop remembered,
    as in a deferred block) and kills its worker."""
    code = textwrap.dedent(f"""
        import multiprocessing, os, signal
        from memdpc.common import interrupts
        from memdpc.pipeline.loader import make_loader
        interrupts.install()
        loader = make_loader({str(tiny_shards)!r}, "rgb", "train", train=True, batch_size=1, size=24,
                             backend="torch", num_workers=1)
        it = iter(loader)
        next(it)
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGTERM)  # remembered only
            for worker in multiprocessing.active_children():
                os.kill(worker.pid, signal.SIGKILL)
            try:
                while True:
                    next(it)
            except interrupts.Interrupted as e:
                print("interrupted", e)
                os._exit(0)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "interrupted SIGTERM", res.stderr[-2000:]


def test_a_worker_never_collects_a_dali_pipeline_it_inherited():
    """A DALI pipeline the main process left as garbage in a reference cycle (as a failed epoch's traceback can)
    must not be destroyed in a forked worker, where its threads do not exist: that aborts or hangs the worker.
    A real DALI pipeline and a real fork; the child runs the workers' init and a full collection."""
    code = textwrap.dedent("""
        import gc, multiprocessing
        from nvidia.dali import fn, pipeline_def
        from memdpc.pipeline.torch_loader import _init_worker

        @pipeline_def(batch_size=1, num_threads=2, device_id=None)
        def noise():
            return fn.random.uniform(range=[0.0, 1.0])

        gc.disable()  # the cycle stays until a collection, which only the child runs
        pipe = noise()
        pipe.build()
        pipe.run()
        cycle = [pipe]
        cycle.append(cycle)
        del pipe, cycle

        def worker():
            _init_worker(0)
            gc.collect()

        p = multiprocessing.get_context("fork").Process(target=worker)
        p.start()
        p.join(30)
        print("hung" if p.is_alive() else f"exit {p.exitcode}")
        if p.is_alive():
            p.kill()
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "exit 0", res.stderr[-2000:]


def test_a_worker_collects_no_garbage_before_its_init(tiny_shards):
    """A forked worker allocates (torch seeds itself) before its init: a collection there could destroy an inherited
    DALI pipeline, the garbage of an earlier epoch (a hang, seen under load). With every allocation triggering a
    collection, no worker of a real loader may collect before it has frozen what it inherited."""
    code = textwrap.dedent(f"""
        import gc, os
        from memdpc.pipeline.loader import make_loader

        parent = os.getpid()

        def watch(phase, info):
            if phase == "start" and os.getpid() != parent and not gc.get_freeze_count():
                os.write(2, b"collected before its init\\n")

        gc.callbacks.append(watch)
        loader = make_loader({str(tiny_shards)!r}, "rgb", "train", train=True, batch_size=2, size=16,
                             backend="torch", num_workers=2)
        default = gc.get_threshold()
        gc.set_threshold(1, 1, 1)  # every allocation collects: in the workers forked by iter()
        batches = iter(loader)
        gc.set_threshold(*default)  # the main process goes on at its own pace
        print(sum(1 for _, _ in zip(range(2), batches)))  # a batch from each worker: both past their init
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and int(res.stdout) == 2, res.stderr[-2000:]
    assert "collected before its init" not in res.stderr
