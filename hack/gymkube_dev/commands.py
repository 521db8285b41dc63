"""`make up` and `make down`, step by step; each step is idempotent, so running `up` again
repairs or confirms what is there."""

from gymkube_dev import HACK, diagnostics
from gymkube_dev import chart as helm_chart
from gymkube_dev.clusters import cluster_up, running_cluster, stop_cluster
from gymkube_dev.console import run_streamed, say, step
from gymkube_dev.errors import StepError
from gymkube_dev.examples import (
    apply_examples,
    delete_examples,
    example_objects,
    restart_pools,
    retry_failed_runs,
    small_node,
)
from gymkube_dev.imagebuild import build_images, load_missing_images
from gymkube_dev.images import image_ref
from gymkube_dev.kube import Kube
from gymkube_dev.settings import UpSettings, UpState, load_state, save_state
from gymkube_dev.summary import print_summary
from gymkube_dev.waits import wait_examples, watch


def up(settings: UpSettings) -> None:
    state = load_state()
    step("tools: kubectl and helm (hack/build-tools.sh, cached)")
    run_streamed([str(HACK / "build-tools.sh"), "kubectl", "helm"], what="tools")
    step("cluster")
    flavour, kubeconfig = cluster_up(settings, state)
    kube = Kube(kubeconfig)
    step("images (make images)")
    ids = build_images(settings, state)
    step(f"images into the {flavour} cluster")
    replaced = load_missing_images(flavour, kube, state, ids)
    ops = settings.operator_namespace
    try:
        step("operator: the chart through pyhelm3")
        helm_chart.install_for_up(kube, settings.release, ops, ids[image_ref("operator")])
        helm_chart.wait_operator(
            kube, settings.release, ops, settings.operator_timeout_s, settings.poll_interval_s
        )
        step(f"examples into namespace {settings.namespace}")
        small, why = small_node(kube, settings)
        if small:
            say(f"small node ({why}): applying the examples with SMALL_NODE_OVERRIDES")
        objects = example_objects(small)
        retry_failed_runs(kube, settings, objects)
        apply_examples(kube, settings, objects)
        restart_pools(kube, settings, objects, replaced)
        watched = watch(settings, objects)
        step("waiting for the pools to be Ready, the GPU run's preflight and the CPU run to end")
        wait_examples(kube, settings, watched)
    except StepError:
        text = diagnostics.dump(kube, settings.namespace, ops, settings.release)
        diagnostics.print_and_save(text)
        raise
    print_summary(kube, settings, flavour, watched, small)


def uninstall_chart(kube: Kube, settings: UpSettings) -> None:
    ns = settings.operator_namespace
    if helm_chart.uninstall(kube, settings.release, ns):
        say(f"release {settings.release} uninstalled (the CRDs stay, as with any Helm chart)")
    else:
        say(f"release {settings.release} is not installed in {ns}")


def down(settings: UpSettings) -> None:
    state = load_state()
    found = running_cluster(state)
    if found is None:
        say("no cluster from `make up` is running: nothing to do")
        return
    flavour, kubeconfig = found
    kube = Kube(kubeconfig) if kubeconfig.is_file() else None
    if kube is not None and kube.reachable():
        step(f"examples out of namespace {settings.namespace}")
        delete_examples(kube, settings)
        step("operator: uninstalling the chart through pyhelm3")
        uninstall_chart(kube, settings)
    stop = settings.down_cluster == "always" or (
        settings.down_cluster == "auto" and state.started_cluster
    )
    step("cluster")
    if stop:
        stop_cluster(flavour)
    else:
        how = "make kind-down" if flavour == "kind" else "make cluster-down"
        say(f"the {flavour} cluster was running before `make up`: left running (`{how}` stops it)")
    # Docker keeps the images: only the record of the cluster goes.
    save_state(UpState(image_inputs=state.image_inputs, built_images=state.built_images))
