/*
 * gymkube's pod sandbox process: holds a pod's namespaces open, reaps orphaned
 * children (it is PID 1 when the pod shares its PID namespace) and exits cleanly
 * on SIGINT/SIGTERM. Built static so the image needs nothing but this binary.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define GYMKUBE_PAUSE_VERSION "1.0"

static void exit_on_signal(int signo) {
  (void)signo;
  _exit(0);
}

static void reap_children(int signo) {
  (void)signo;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

static int install(int signo, void (*handler)(int), int flags) {
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = handler;
  action.sa_flags = flags;
  return sigaction(signo, &action, NULL);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    printf("gymkube-pause %s\n", GYMKUBE_PAUSE_VERSION);
    return 0;
  }
  if (getpid() != 1) {
    fprintf(stderr, "gymkube-pause: warning: not running as PID 1\n");
  }
  if (install(SIGINT, exit_on_signal, 0) < 0 || install(SIGTERM, exit_on_signal, 0) < 0 ||
      install(SIGCHLD, reap_children, SA_NOCLDSTOP) < 0) {
    fprintf(stderr, "gymkube-pause: sigaction: %s\n", strerror(errno));
    return 1;
  }
  for (;;) {
    pause();
  }
}
