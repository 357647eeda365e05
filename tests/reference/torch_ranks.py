"""The ranks of the torch.distributed reference scripts (torch_allreduce.py, torch_ddp.py): each
rank's process group (NCCL on GPUs, one GPU per local rank; gloo on the CPU), its synchronisation
and the slowest rank's figure; and the launch: ranks spawned here unless RANK and WORLD_SIZE are
set (torchrun)."""
import os


class Ranks:
    """This rank's process group, as a.device and a.port ask: dist, dev, gpu, sync(), slowest(x)."""

    def __init__(self, rank, world, a):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.rank, self.world = torch, dist, rank, world
        self.gpu = a.device != "cpu"
        if self.gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(a.port))
        dist.init_process_group("nccl" if self.gpu else "gloo", rank=rank, world_size=world)
        self.dev = torch.device("cuda") if self.gpu else torch.device("cpu")

    def sync(self):
        if self.gpu:
            self.torch.cuda.synchronize()

    def write(self, a, rows, key, metrics, **extra):
        """Rank 0 writes rows to a.json (when given) with the run's environment, as tf.results.write
        does; every rank then leaves its process group."""
        if self.rank == 0 and a.json:
            import results_file
            torch = self.torch
            nccl = ".".join(map(str, torch.cuda.nccl.version())) if self.gpu else None
            env = results_file.env(device=torch.cuda.get_device_name() if self.gpu else "cpu", torch=torch.__version__,
                                   cuda=torch.version.cuda, nccl=nccl, backend=self.dist.get_backend(),
                                   world_size=self.world, options=vars(a))
            results_file.write(a.json, rows, key, metrics, env, **extra)
            print("wrote " + a.json)
        self.dist.destroy_process_group()

    def slowest(self, x):
        """The largest of every rank's x (a time: the slowest rank's)."""
        t = self.torch.tensor([x], dtype=self.torch.float64, device=self.dev)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.item()


def launch(rank_main, a):
    """rank_main(rank, world, a) in this process under torchrun, else in a.nproc spawned ones."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a)
        return
    import torch.multiprocessing as mp
    mp.spawn(rank_main, args=(a.nproc, a), nprocs=a.nproc, join=True)
