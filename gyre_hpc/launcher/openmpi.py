"""Open MPI environment settings for ranks that share one machine; pure constants (standard library only).

They sit below the live wing and the SLURM renderer alike: ``gyre train``'s mpirun launcher
(``gyre_hpc.live.launch``) exports both sets into its ranks, and the sbatch/jobspec renderers (``gyre_hpc.slurm``)
write ``LOCAL_EXPORTS`` into the local emulated cluster's scripts.

Invariants
- Every entry is ``NAME=VALUE`` (split once at the first ``=``).
- No setting makes a rank listen on a non-loopback address.
"""

#: Open MPI over TCP on the loopback interface: the emulated nodes of scripts/local-slurm.sh share one machine,
#: and Open MPI's shared-memory transport segfaults across them (docs/slurm-local.md).
LOCAL_EXPORTS = ("OMPI_MCA_btl=self,tcp", "OMPI_MCA_btl_tcp_if_include=lo", "OMPI_MCA_oob_tcp_if_include=lo",
                 "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")

#: ``gyre train`` on one machine (mpirun, no emulated nodes): Open MPI over shared memory, so that no rank opens a
#: TCP listener (the TCP BTL of Open MPI 4.1 listens on 0.0.0.0 and :: whatever btl_tcp_if_include says; measured
#: in docs/reliability.md); no single-copy (CMA needs ptrace rights that containers often lack).
SINGLE_HOST_EXPORTS = ("OMPI_MCA_btl=self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism=none")
