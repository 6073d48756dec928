"""An MPI world (``mpirun``, Kubeflow's MPIJob) as a multi-worker cluster, so that
multi_worker_mirrored needs no Horovod: every process picks a free port and the address the
others reach it at (``env.local_address``), and MPI's allgather hands every process the whole
list, in rank order. Rank 0 is worker 0, the chief. No TensorFlow here.

MPI carries these few bytes only; TensorFlow's collectives then run over their own gRPC
connections. mpi4py is an optional extra (``pip install '.[mpi]'``).
"""

import os
import socket

from tfgpu.distribute import DistributeError, env, gpu_share
from tfgpu.errors import INSTALL_HOROVOD, install_extra


# (local rank, local size) variables: Open MPI, MPICH/Intel MPI's Hydra, MVAPICH.
_LOCAL_VARIABLES = (
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
)


def local_gpus(num_gpus: int, environ=os.environ) -> list[int]:
    """Positions, among the ``num_gpus`` GPUs this rank sees, of those it should use: its
    equal share of the machine's, by its local rank (``mpirun -np 8`` on an 8-GPU machine:
    one each), since multi_worker_mirrored would otherwise take every GPU in every rank."""
    for rank_name, size_name in _LOCAL_VARIABLES:
        if rank_name in environ and size_name in environ:
            return gpu_share(num_gpus, int(environ[rank_name]), int(environ[size_name]))
    return list(range(num_gpus))


def _comm_world():
    try:
        from mpi4py import MPI  # noqa: PLC0415  (MPI_Init happens at this import)
    except ImportError:
        raise DistributeError(
            "multi_worker_mirrored under mpirun exchanges the workers' addresses through MPI: "
            f"{install_extra('mpi')} (mpi4py), or build Horovod with MPI "
            f"({INSTALL_HOROVOD}) and use --strategy=auto"
        ) from None
    return MPI.COMM_WORLD


def cluster_from(entries: list[dict], rank: int) -> dict:
    """The TF_CONFIG dict of rank ``rank`` from every rank's ``{"host", "address", "port"}``:
    all on one machine, they meet on localhost; otherwise each at its own address."""
    one_machine = len({e["host"] for e in entries}) == 1
    workers = [f"{'localhost' if one_machine else e['address']}:{e['port']}" for e in entries]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}


def tf_config(found: env.World) -> dict:
    """This process's TF_CONFIG dict, built with the other ranks of ``found`` (an MPI world);
    a collective: every rank calls it. Raises DistributeError when mpi4py is missing or sees
    another world than the launcher's variables (mpi4py built for another MPI)."""
    comm = _comm_world()
    if comm.Get_size() != found.size:
        raise DistributeError(
            f"mpi4py sees {comm.Get_size()} process(es) but {found.evidence}: mpi4py is built "
            "for another MPI than the mpirun that started this job; reinstall it against that "
            "MPI (pip install --no-binary mpi4py mpi4py)"
        )
    mine = {
        "host": socket.gethostname(),
        "address": env.local_address(),
        "port": env.free_ports(1)[0],
    }
    return cluster_from(comm.allgather(mine), comm.Get_rank())
