# One entry point for everything: `make test` and `make demo` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv test demo crds check-crds lint coverage clean

venv: $(STAMP)

# torch==2.13.0 resolves to the CPU wheel on this machine's disk; never pull a CUDA build into CI.
$(STAMP): operator/pyproject.toml trainer-image/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e 'operator[test]' -e 'trainer-image[test]'
	touch $(STAMP)

# Most tests wait on real processes (rendezvous, timeouts, polls), not on the CPU, so they run on
# TEST_WORKERS pytest-xdist workers; the tests marked `serial` (wall-clock deadlines and CPU budgets a
# busy neighbour would skew: pytest.ini) run after them, alone. Both parts always run; a part with no
# test selected (exit 5, e.g. PYTEST_ARGS naming one file) is not a failure. PYTEST_ARGS narrows by
# path or -k (-m would replace the split).
# The serial part collects only SERIAL's files unless PYTEST_ARGS narrows it. Each pytest process compiles the test
# files it collects: where the environment says not to write bytecode, every one of them compiled them all again.
TEST_WORKERS ?= 2
test: export PYTHONDONTWRITEBYTECODE =
test: venv lint
	@status=0; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not serial" $(PYTEST_ARGS) || [ $$? -eq 5 ] || status=1; \
	$(BIN)/python -m pytest -m serial $(if $(PYTEST_ARGS),$(PYTEST_ARGS),$$($(BIN)/python -m tests.conftest)) || [ $$? -eq 5 ] || status=1; \
	exit $$status

# pyflakes' findings and syntax errors in every Python file (ruff.toml); clean before any test runs.
lint: venv
	$(BIN)/ruff check .

# The suite under coverage, every process it starts measured: the pods' agent, torchrun, trainers
# (.coveragerc, tests/coverage_everywhere.py). Slower than `make test`; not part of it.
coverage: venv
	rm -rf .coverage-data && mkdir -p .coverage-data
	-$(BIN)/python -m coverage run -m pytest -p tests.coverage_everywhere $(PYTEST_ARGS)
	$(BIN)/python -m coverage combine -q
	$(BIN)/python -m coverage report
	$(BIN)/python -m coverage html -d .coverage-data/html

# The chart ships a byte-identical copy of the CRD (a test checks it).
crds: venv
	$(BIN)/ddpjob crd > crds/ddpjobs.elastic.ddp.dev.yaml
	cp crds/ddpjobs.elastic.ddp.dev.yaml charts/ddpjob-operator/crds/

check-crds: venv
	$(BIN)/ddpjob crd | diff -u crds/ddpjobs.elastic.ddp.dev.yaml -
	diff -u crds/ddpjobs.elastic.ddp.dev.yaml charts/ddpjob-operator/crds/ddpjobs.elastic.ddp.dev.yaml

clean:
	rm -rf $(VENV) .pytest_cache .ddpjob .coverage-data

# ---- images, kind, helm, e2e ----
# Images are tagged with their package's version; kind gets a GPU node when the host has the
# NVIDIA driver and container toolkit (hack/kind/gpu.yaml), otherwise CPU only (hack/kind/cpu.yaml).
package_version = $(shell sed -n 's/^version = "\(.*\)"/\1/p' $(1)/pyproject.toml)
OPERATOR_VERSION := $(call package_version,operator)
TRAINER_VERSION := $(call package_version,trainer-image)
REGISTRY ?= ghcr.io/ddpjob
OPERATOR_REPOSITORY ?= $(REGISTRY)/ddpjob-operator
TRAINER_REPOSITORY ?= $(REGISTRY)/ddp-trainer
OPERATOR_IMAGE := $(OPERATOR_REPOSITORY):$(OPERATOR_VERSION)
TRAINER_IMAGE := $(TRAINER_REPOSITORY):$(TRAINER_VERSION)
# examples/byo: a user's own script in an image derived from the trainer's (docs/your-own-script.md).
BYO_IMAGE ?= $(REGISTRY)/byo-text:$(TRAINER_VERSION)
# examples/hf: the Hugging Face Trainer with the DDPJob callback (docs/hf-and-lightning.md).
HF_IMAGE ?= $(REGISTRY)/hf-tiny-lm:$(TRAINER_VERSION)
# examples/lightning: PyTorch Lightning with the DDPJob callback (docs/hf-and-lightning.md).
LIGHTNING_IMAGE ?= $(REGISTRY)/lightning-tiny:$(TRAINER_VERSION)
KIND_CLUSTER ?= ddpjob
KIND_KUBECONFIG ?= $(HOME)/.kube/kind-$(KIND_CLUSTER).yaml
KIND_GPU ?= $(shell command -v nvidia-ctk >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
KIND_CONFIG ?= hack/kind/$(if $(KIND_GPU),gpu,cpu).yaml
HELM_RELEASE ?= ddpjob-operator
HELM_NAMESPACE ?= ddpjob-system
E2E_ARGS ?=
# The fault-injection command of the e2e fault tests (interface in hack/kind/faults.sh).
DDPJOB_E2E_FAULTS ?= $(CURDIR)/hack/kind/faults.sh

.PHONY: images kind-up kind-load helm-install e2e kind-down chart-files

images:
	docker build -f operator/Dockerfile --build-arg VERSION=$(OPERATOR_VERSION) -t $(OPERATOR_IMAGE) operator
	docker build -f trainer-image/Dockerfile --build-arg VERSION=$(TRAINER_VERSION) -t $(TRAINER_IMAGE) trainer-image
	docker build -f examples/byo/Dockerfile --build-arg TRAINER_IMAGE=$(TRAINER_IMAGE) -t $(BYO_IMAGE) .
	docker build -f examples/hf/Dockerfile --build-arg TRAINER_IMAGE=$(TRAINER_IMAGE) -t $(HF_IMAGE) .
	docker build -f examples/lightning/Dockerfile --build-arg TRAINER_IMAGE=$(TRAINER_IMAGE) -t $(LIGHTNING_IMAGE) .

kind-up:
	@mkdir -p $(dir $(KIND_KUBECONFIG))
	kind get clusters | grep -qx '$(KIND_CLUSTER)' || \
		kind create cluster --name $(KIND_CLUSTER) --config $(KIND_CONFIG) --kubeconfig $(KIND_KUBECONFIG) --wait 180s
	$(if $(KIND_GPU),hack/kind/gpu-setup.sh $(KIND_CLUSTER) $(KIND_KUBECONFIG))
	@echo "export KUBECONFIG=$(KIND_KUBECONFIG)"

kind-load:
	kind load docker-image --name $(KIND_CLUSTER) $(OPERATOR_IMAGE) $(TRAINER_IMAGE) $(BYO_IMAGE) $(HF_IMAGE) \
		$(LIGHTNING_IMAGE)

# helm upgrade never touches crds/, so the CRD is applied first: upgrades get schema changes too.
helm-install:
	kubectl --kubeconfig $(KIND_KUBECONFIG) apply --server-side -f charts/ddpjob-operator/crds/
	helm upgrade --install $(HELM_RELEASE) charts/ddpjob-operator --kubeconfig $(KIND_KUBECONFIG) \
		--namespace $(HELM_NAMESPACE) --create-namespace \
		--set image.repository=$(OPERATOR_REPOSITORY) --set image.tag=$(OPERATOR_VERSION) \
		--wait --timeout 5m

e2e: venv
	KUBECONFIG=$(KIND_KUBECONFIG) DDPJOB_E2E_OPERATOR_NAMESPACE=$(HELM_NAMESPACE) DDPJOB_E2E_TRAINER_IMAGE=$(TRAINER_IMAGE) DDPJOB_E2E_BYO_IMAGE=$(BYO_IMAGE) DDPJOB_E2E_HF_IMAGE=$(HF_IMAGE) \
		DDPJOB_E2E_FAULTS=$(DDPJOB_E2E_FAULTS) $(BIN)/python -m pytest tests/e2e -m e2e -v $(E2E_ARGS)

kind-down:
	kind delete cluster --name $(KIND_CLUSTER) --kubeconfig $(KIND_KUBECONFIG)

# The chart ships copies of generated files: the CRD and the RBAC rules (tests check both).
chart-files: crds
	$(BIN)/ddpjob rbac-rules > charts/ddpjob-operator/files/rbac-rules.yaml

# ---- demo ----
# The README's first command: the bundled digits DDPJob on this machine with 2 workers; worker 1
# is SIGKILLed midway, replaced, and training resumes from the last checkpoint (docs/local.md).
DEMO_KILL_AT_STEP ?= 300

demo: venv
	$(BIN)/ddpjob run examples/cpu-digits.yaml --local --kill-worker 1 --kill-at-step $(DEMO_KILL_AT_STEP)
