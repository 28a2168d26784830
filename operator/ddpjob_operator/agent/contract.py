"""The contract between the operator, the worker agent (worker.py, zygote.py) and the trainer runtime:
environment variables, termination-message words, store keys and exit codes. Standard library only and no
imports of its own: the pod's program carries this file's source (agent/__init__.py), and the trainer
image's copies of a few of these values are kept equal by tests."""

TERMINATION_LOG_ENV = "DDPJOB_TERMINATION_LOG"
TERMINATION_LOG_PATH = "/dev/termination-log"  # the container's default terminationMessagePath
# Kubernetes keeps at most 4096 bytes of a container's termination message.
TERMINATION_MESSAGE_LIMIT = 4000
# The launcher starts its message with this when torchrun could not form the group (join timeout,
# a closed or unreachable rendezvous): an infrastructure failure, retried in a fresh generation.
RENDEZVOUS_FAILED_PREFIX = "rendezvous failed"
# ...and ends it with this when its exit closed the generation's rendezvous for every agent (torch's
# launch_agent closes it on any exit but a signal): no replacement may join that generation again.
RENDEZVOUS_CLOSED_MARK = "[rendezvous closed]"

# What Gloo and NCCL say when a collective failed because another rank did (died, vanished, froze
# until the collective timed out), as it reaches a termination message. The trainer runtime's
# is_peer_failure uses the same pattern (a test keeps the two equal).
PEER_FAILURE_PATTERN = (r"Connection (closed|reset) by peer|Broken pipe|Connection refused|Timed out|timed out|"
                        r"timeout caused pair closure|NCCL (communicator was aborted|error)|remote process exited|"
                        r"ncclRemoteError|ProcessGroupNCCL.*(Watchdog|abort)|Socket Timeout|Read error")

# Survivors rejoin in place (restartScope Pod): when a peer's failure ends a generation, a surviving
# agent keeps its pod and joins the next generation once the operator has started a pod for it. The
# channel is the job's rendezvous store, which outlives every worker: every agent publishes its
# generation there when it starts (GENERATION_KEY holds the newest, NNODES_KEY its node range), and
# the operator starts a generation's pods only after it has charged the incident that ended the last
# one, so a survivor never moves without the status having moved first.
REJOIN_ENV = "DDPJOB_REJOIN"  # "1": wait for the next generation in place instead of exiting
REJOIN_TIMEOUT_ENV = "DDPJOB_REJOIN_TIMEOUT_SECONDS"
REJOIN_TIMEOUT_SECONDS = 120  # longer than a node controller's verdict on a silent node plus a pod start
GENERATION_KEY = "ddpjob/{uid}/generation"
NNODES_KEY = "ddpjob/{uid}/nnodes/{generation}"
# A survivor that waited REJOIN_TIMEOUT_SECONDS for a newer generation and saw none starts its message
# with this; every message ends with the generation its failure happened in (GENERATION_MARK).
REJOIN_FAILED_PREFIX = "rejoin failed"
# A trainer's exit after a stop its ranks agreed on (the runtime's StopRequest.exit_code, 128 + SIGTERM or
# SIGINT). The ranks of a pod that got no signal exit so too when a peer's pod is stopped (deleted,
# evicted, preempted): their launcher, whose agent got no signal either, takes it for a peer's failure.
STOP_EXIT_CODES = (143, 130)
GENERATION_MARK = "[generation {generation}]"
GENERATION_MARK_PATTERN = r"\[generation (\d+)\]"

# A warm spare (failurePolicy.spares) runs the same launcher with SPARE_ENV=1: it imports what a worker
# imports, joins no rendezvous, and asks for its assignment (the replica index and generation whose place
# it takes) until the operator gives one: from the operator's progress endpoint in a pod (the URL and token
# the pod has for progress reports, path ASSIGNMENT_PATH), from ASSIGNMENT_FILE_ENV in a local run.
SPARE_ENV = "DDPJOB_SPARE"
ASSIGNMENT_FILE_ENV = "DDPJOB_ASSIGNMENT_FILE"
ASSIGNMENT_PATH = "assignment"  # replaces the last segment ("progress") of the progress URL
# With INPROCESS_ENV=1 a worker's agent asks the same endpoint (path GENERATION_PATH) every GENERATION_POLL_SECONDS
# for the generation the operator carried its pod into, and publishes it in the job's store (GENERATION_KEY, NNODES_KEY),
# where the trainers look for a newer one at every step boundary: an in-place scale down starts no pod whose agent
# would publish it (the operator's decisions/scaling.py).
GENERATION_PATH = "generation"
GENERATION_POLL_SECONDS = 2.0
GENERATION_FILE_ENV = "DDPJOB_GENERATION_FILE"  # local runs: the runner writes the same answer to this file
PROGRESS_URL_ENV = "DDPJOB_PROGRESS_URL"
PROGRESS_TOKEN_ENV = "DDPJOB_PROGRESS_TOKEN_FILE"
PROGRESS_CA_ENV = "DDPJOB_PROGRESS_CA"  # PEM: the CA the client verifies an https endpoint with
# A spare is ready (its pod's readiness probe, job_manifests.spare_pod; locally the runner) once this file exists:
# the launcher writes it once its imports are done and the operator gave a valid answer to its first
# assignment request (204 nothing yet, or 200; locally the assignment file's directory read). A spare that
# can never take a place (a NetworkPolicy, a CA it cannot verify, no token) is never Ready, never promoted.
SPARE_READY_FILE_ENV = "DDPJOB_SPARE_READY_FILE"
SPARE_COMPLAINT_SECONDS = 30  # a spare whose requests keep failing says why at most this often
# With INPROCESS_ENV=1 a spare's agent starts its trainers before it has a place: they build what does not
# depend on the rank, then wait for the assignment, which the agent writes (JSON, after publishing its generation)
# under a store key of its own that it names in their environment (the trainer runtime's inprocess.SPARE_PLACE_ENV).
SPARE_PLACE_ENV = "DDPJOB_SPARE_PLACE_KEY"
SPARE_PLACE_KEY = "ddpjob/{uid}/spare/{token}"
# Each trainer sets this key once it is built and waits for its place; the agent marks the spare ready (the
# readiness file) only once every one of its trainers has.
SPARE_BUILT_KEY = "{place}/built/{local_rank}"

# The trainer runtime's exit for a checkpoint volume that is full or keeps failing reads (its
# CHECKPOINT_VOLUME_* constants; a test keeps the two equal): infrastructure, never the user's bug.
CHECKPOINT_VOLUME_EXIT_CODE = 75
CHECKPOINT_VOLUME_PREFIXES = ("checkpoint volume full:", "checkpoint volume unreadable:")

# The local runner's zygote preloads the entrypoint's imports too; it gets the entrypoint here (the
# worker's argv after torchrun's flags, as JSON).
PRELOAD_ENV = "DDPJOB_ZYGOTE_PRELOAD"

# On a node without GPUs the trainer starts as a fork of the agent, which has imported torch already,
# instead of a new interpreter importing it again: seconds off every start and restart
# (bench/recovery.py). Where a GPU is visible it starts as a new interpreter, as torchrun does: CUDA
# cannot be used in a child forked after the agent touched it. 0 or 1 in the pod's env forces either.
FORK_TRAINER_ENV = "DDPJOB_FORK_TRAINER"
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's and AMD's driver nodes

# "1": the trainers form their process group per generation through the job's store and survive a peer's
# failure in process (agent/worker.py, the trainer runtime's inprocess.py); "" (off) everywhere the operator
# has not switched it on, so an envFrom cannot.
INPROCESS_ENV = "DDPJOB_INPROCESS"
