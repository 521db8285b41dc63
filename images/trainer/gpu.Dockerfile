# gymkube GPU trainer: verl 0.9.1 with its vLLM extra (vLLM 0.24.0, torch 2.11.0 and the CUDA
# libraries torch ships as wheels) plus gymkube-agentloop. A `device: gpu` TrainingRun (the default)
# runs it. The wheels are about 4 GB and the image about 11 GB, so it is not part of `make images`;
# build it where the image will be pushed from (docs/install.md):
#
#   hack/build-images.sh trainer
#
# The base image needs python3.11 (the ABI of the wheels), tini, a C compiler and the Python headers
# (Triton compiles its launchers at run time): `hack/base-image.sh build` makes
# gymkube/base-build:bookworm. The GPU driver comes from the node (NVIDIA container toolkit).
ARG TRAINER_BASE_IMAGE=gymkube/base-build:bookworm

FROM ${TRAINER_BASE_IMAGE} AS trainer
# The wheels are not in the build context: hack/build-images.sh serves out/wheels/trainer on the
# host's loopback (WHEELS_URL; this build runs with --network host for that) and pip reads nothing
# else (--no-index). WHEELS_HASH changes with the wheels, so the layer is rebuilt when they do. A pip
# of its own installs them and is removed again; the image is base + this one environment.
ARG WHEELS_URL
ARG WHEELS_HASH
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin gymkube
RUN echo "trainer wheels ${WHEELS_HASH}" \
    && python3 -m venv /opt/pip \
    && python3 -m venv --without-pip /opt/gymkube \
    && /opt/pip/bin/pip --python /opt/gymkube/bin/python install --no-index --no-cache-dir \
        --find-links "${WHEELS_URL}/" "verl[vllm]==0.9.1" gymkube-agentloop \
    && rm -rf /opt/pip
# HOME is where Hugging Face, Triton and vLLM keep their caches.
ENV PATH=/opt/gymkube/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/gymkube
USER 10001:10001
WORKDIR /home/gymkube
# The operator supplies the command (verl's main_ppo, or `ray start` on a RayJob's nodes); run bare,
# the image prints the versions it carries.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python3", "-c", "import verl, vllm, gymkube_agentloop; print('verl', verl.__version__, 'vllm', vllm.__version__)"]

