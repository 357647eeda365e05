/* tfhost --nproc N (launch.h): start the ranks, relay their output line by
 * line with the rank in front, and end the whole run as soon as one rank
 * fails or the user presses Ctrl-C: never a hang, never a rank left behind. */
#define _DEFAULT_SOURCE /* kill, setenv with _POSIX_C_SOURCE */
#include "launch.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "device.h"
#include "dist.h"
#include "exit_codes.h"

enum { TF_LAUNCH_MAX = 256, TF_LINE_MAX = 65536 };

/* One stream being relayed: a child's stdout or stderr (fork), or
 * mpirun's (tagged lines of every rank). */
typedef struct tf_relay {
  int fd;
  int rank;    /* -1: mpirun's own output, tagged per line */
  bool is_err; /* goes to our stderr */
  char buf[TF_LINE_MAX];
  size_t len;
} tf_relay;

static volatile sig_atomic_t tf_launch_signal;
static void tf_launch_on_signal(int sig) { tf_launch_signal = sig; }

/* mpirun's own messages, kept to explain a failure. */
static char tf_mpirun_said[16384];
static size_t tf_mpirun_said_len;

/* One line of rank's output (no newline), prefixed unless rank 0's stdout. */
static void tf_emit(int rank, bool is_err, const char *line, size_t n) {
  FILE *to = is_err ? stderr : stdout;
  if (rank > 0 || is_err) fprintf(to, "[rank %d] ", rank);
  fwrite(line, 1, n, to);
  fputc('\n', to);
  fflush(to);
}

/* text (n bytes) without the copies of tag (tn bytes) inside it, into out
 * (n bytes at least); its length. mpirun tags each piece it reads from a
 * rank, so a line whose halves reached it apart comes as
 * "[1,1]<stdout>:first[1,1]<stdout>:second" (Open MPI does this now and
 * then under load). */
static size_t tf_untag(const char *text, size_t n, const char *tag, size_t tn, char *out) {
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    if (n - i >= tn && memcmp(text + i, tag, tn) == 0) {
      i += tn;
      continue;
    }
    out[k++] = text[i++];
  }
  return k;
}

/* A line of mpirun's --tag-output: "[job,rank]<stdout>:text"; anything
 * else is mpirun speaking for itself. */
static void tf_emit_mpirun(const char *line, size_t n) {
  int job, rank, used = 0;
  char stream[8];
  char head[64];
  size_t hn = n < sizeof head - 1 ? n : sizeof head - 1;
  memcpy(head, line, hn);
  head[hn] = '\0';
  if (sscanf(head, "[%d,%d]<%6[a-z]>:%n", &job, &rank, stream, &used) == 3 && used > 0) {
    static char text[TF_LINE_MAX];
    const size_t tn = tf_untag(line + used, n - (size_t)used, line, (size_t)used, text);
    tf_emit(rank, strcmp(stream, "stderr") == 0, text, tn);
    return;
  }
  if (tf_mpirun_said_len + n + 2 < sizeof tf_mpirun_said) {
    memcpy(tf_mpirun_said + tf_mpirun_said_len, line, n);
    tf_mpirun_said_len += n;
    tf_mpirun_said[tf_mpirun_said_len++] = '\n';
    tf_mpirun_said[tf_mpirun_said_len] = '\0';
  }
}

static void tf_relay_line(tf_relay *r, const char *line, size_t n) {
  if (r->rank < 0)
    tf_emit_mpirun(line, n);
  else
    tf_emit(r->rank, r->is_err, line, n);
}

/* Reads what is there; false at end of file. Whole lines go out, a line
 * longer than the buffer in pieces. */
static bool tf_relay_read(tf_relay *r) {
  ssize_t k = read(r->fd, r->buf + r->len, sizeof r->buf - r->len);
  if (k < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (k <= 0) {
    if (r->len) tf_relay_line(r, r->buf, r->len);
    r->len = 0;
    return false;
  }
  r->len += (size_t)k;
  size_t start = 0;
  for (size_t i = 0; i < r->len; i++) {
    if (r->buf[i] == '\n') {
      tf_relay_line(r, r->buf + start, i - start);
      start = i + 1;
    }
  }
  if (start == 0 && r->len == sizeof r->buf) {
    tf_relay_line(r, r->buf, r->len);
    start = r->len;
  }
  memmove(r->buf, r->buf + start, r->len - start);
  r->len -= start;
  return true;
}

/* A TCP port free now, for MASTER_PORT (and MASTER_PORT + 1). */
static int tf_free_port(void) {
  for (int attempt = 0; attempt < 20; attempt++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
      port = ntohs(a.sin_port);
    close(fd);
    if (port > 0 && port < 65535) return port;
  }
  return 29500; /* torchrun's default */
}

/* The first of PATH's directories holding an executable name, into out. */
static bool tf_find_in_path(const char *name, char *out, size_t n) {
  const char *path = getenv("PATH");
  while (path && *path) {
    const char *colon = strchr(path, ':');
    size_t len = colon ? (size_t)(colon - path) : strlen(path);
    if (len > 0 && (size_t)snprintf(out, n, "%.*s/%s", (int)len, path, name) < n && access(out, X_OK) == 0) return true;
    path = colon ? colon + 1 : NULL;
  }
  return false;
}

/* This binary's path, so that every rank runs the same tfhost. */
static const char *tf_self_path(char *buf, size_t n, const char *argv0) {
  ssize_t k = readlink("/proc/self/exe", buf, n - 1);
  if (k <= 0) return argv0;
  buf[k] = '\0';
  return buf;
}

static void tf_set_env_int(const char *name, long v) {
  char s[32];
  snprintf(s, sizeof s, "%ld", v);
  setenv(name, s, 1);
}

/* The environment every rank shares. */
static void tf_launch_env(int nproc) {
  setenv("TFHOST_LAUNCHER", "tfhost", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 0);
  if (!getenv("MASTER_PORT")) tf_set_env_int("MASTER_PORT", tf_free_port());
  /* CPU ranks share the machine's cores rather than each taking them all */
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (!getenv("TF_NUM_THREADS") && !getenv("OMP_NUM_THREADS"))
    tf_set_env_int("TF_NUM_THREADS", cores / nproc > 0 ? cores / nproc : 1);
  if (geteuid() == 0) { /* Open MPI refuses root unless told twice */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
}

/* fork + exec of argv with stdout/stderr into the pipes out[0], err[0]. */
static pid_t tf_spawn(char **argv, int out[2], int err[2], int rank, int world) {
  if (pipe(out) != 0 || pipe(err) != 0) return -1;
  pid_t pid = fork();
  if (pid != 0) {
    close(out[1]);
    close(err[1]);
    return pid;
  }
#ifdef __linux__
  prctl(PR_SET_PDEATHSIG, SIGTERM); /* the launcher gone (killed), the rank goes too */
#endif
  if (rank >= 0) { /* under mpirun, MPI's variables say it */
    tf_set_env_int("RANK", rank);
    tf_set_env_int("LOCAL_RANK", rank);
    tf_set_env_int("WORLD_SIZE", world);
    tf_set_env_int("LOCAL_WORLD_SIZE", world);
  }
  dup2(out[1], STDOUT_FILENO);
  dup2(err[1], STDERR_FILENO);
  close(out[0]), close(out[1]), close(err[0]), close(err[1]);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  execv(argv[0], argv);
  fprintf(stderr, "tfhost: cannot run %s: %s\n", argv[0], strerror(errno));
  _exit(TF_EXIT_NOEXEC);
}

static int64_t tf_ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int tf_exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return TF_EXIT_SIGNAL + WTERMSIG(status);
  return TF_EXIT_SCRIPT;
}

/* mpirun's account of a failed run: the rank it names first, and the
 * signal that killed it (0: it exited). */
static int tf_mpirun_failed_rank(int *signal_number) {
  *signal_number = 0;
  const char *p = strstr(tf_mpirun_said, "Process name:");
  int job, step, rank;
  if (p && sscanf(p, "Process name: [[%d,%d],%d]", &job, &step, &rank) == 3) return rank;
  p = strstr(tf_mpirun_said, "noticed that process rank");
  if (p && sscanf(p, "noticed that process rank %d with PID %*d on node %*s exited on signal %d", &rank,
                  signal_number) == 2)
    return rank;
  return -1;
}

/* A run of tfhost --nproc: its children (the ranks, or mpirun alone), the
 * streams being relayed, and how the children ended. */
typedef struct tf_run {
  int nproc;
  bool use_mpirun;
  char **cmd;  /* the command line every child runs */
  int nchild;  /* nproc, or 1 (mpirun) */
  pid_t *pids; /* 0 once ended */
  int *codes;  /* exit codes of the ended ones */
  tf_relay *relays; /* stdout and stderr of child i at 2i, 2i+1 */
  struct pollfd *fds;
  int running, open_fds;
  int first_failed, first_code; /* the first child that ended badly, its code */
  int64_t stop_at;  /* when the others were told to stop (SIGTERM), for the SIGKILL after */
  int64_t ended_at; /* when the last child ended */
  bool interrupted;
} tf_run;

static void tf_run_free(tf_run *run) {
  free(run->cmd), free(run->pids), free(run->codes), free(run->relays), free(run->fds);
}

/* A count the launcher can start, and a GPU for every rank when it has GPUs
 * (TF_EXIT_USAGE and the reason otherwise). */
static int tf_launch_check(int nproc) {
  if (nproc < 1 || nproc > TF_LAUNCH_MAX) {
    fprintf(stderr, "tfhost: --nproc needs a count in 1..%d\n", TF_LAUNCH_MAX);
    return TF_EXIT_USAGE;
  }
  const char *device = getenv("TFHOST_DEVICE_OPTION"); /* main sets it from --device */
  int gpus = tf_cuda_device_count();
  if (gpus > 0 && nproc > gpus && !(device && strcmp(device, "cpu") == 0)) {
    fprintf(stderr,
            "tfhost: --nproc %d on a machine with %d GPU(s): each rank needs a GPU of its own (NCCL will not put "
            "two ranks on one); ask for at most %d, or run CPU ranks with --device cpu\n",
            nproc, gpus, gpus);
    return TF_EXIT_USAGE;
  }
  return TF_EXIT_OK;
}

/* The children's command line, into run->cmd: this binary with argv's
 * options and script, behind mpirun's own when mpirun starts the ranks. */
static bool tf_launch_command(tf_run *run, int argc, char **argv) {
  static char self[4096], mpirun[4096], np[16];
  const char *exe = tf_self_path(self, sizeof self, argv[0]);
  run->use_mpirun =
      tf_dist_mpi_compiled() && !getenv("TFHOST_NO_MPIRUN") && tf_find_in_path("mpirun", mpirun, sizeof mpirun);
  run->cmd = calloc((size_t)argc + 16, sizeof(char *));
  if (!run->cmd) return false;
  int c = 0;
  snprintf(np, sizeof np, "%d", run->nproc);
  if (run->use_mpirun) {
    const char *head[] = {mpirun, "-np", np, "--oversubscribe", "--bind-to", "none", "--tag-output"};
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) run->cmd[c++] = (char *)head[i];
  }
  run->cmd[c++] = (char *)exe;
  for (int i = 1; i < argc; i++) run->cmd[c++] = argv[i];
  run->cmd[c] = NULL;
  return true;
}

/* Ctrl-C, SIGTERM and SIGHUP stop the ranks instead of the launcher. */
static void tf_launch_catch_signals(void) {
  struct sigaction sa = {.sa_handler = tf_launch_on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

/* Starts every child with its two streams to relay; on failure kills those
 * already started. */
static bool tf_launch_spawn(tf_run *run) {
  run->nchild = run->use_mpirun ? 1 : run->nproc;
  const size_t n = (size_t)run->nchild;
  run->pids = calloc(n, sizeof(pid_t));
  run->codes = calloc(n, sizeof(int));
  run->relays = calloc(n * 2, sizeof(tf_relay));
  run->fds = calloc(n * 2, sizeof(struct pollfd));
  if (!run->pids || !run->codes || !run->relays || !run->fds) {
    fprintf(stderr, "tfhost: --nproc: out of memory\n");
    return false;
  }
  for (int i = 0; i < run->nchild; i++) {
    int out[2], err[2];
    const int rank = run->use_mpirun ? -1 : i;
    run->pids[i] = tf_spawn(run->cmd, out, err, rank, run->nproc);
    if (run->pids[i] < 0) {
      fprintf(stderr, "tfhost: cannot start rank %d: %s\n", i, strerror(errno));
      for (int j = 0; j < i; j++) kill(run->pids[j], SIGKILL);
      return false;
    }
    run->relays[2 * i] = (tf_relay){.fd = out[0], .rank = rank, .is_err = false};
    run->relays[2 * i + 1] = (tf_relay){.fd = err[0], .rank = rank, .is_err = true};
  }
  run->running = run->nchild;
  run->open_fds = run->nchild * 2;
  run->first_failed = -1;
  return true;
}

/* Relays what the open streams have now, waiting at most 100 ms for it. */
static void tf_launch_relay(tf_run *run) {
  int n = 0;
  for (int i = 0; i < run->nchild * 2; i++) {
    if (run->relays[i].fd >= 0) run->fds[n++] = (struct pollfd){.fd = run->relays[i].fd, .events = POLLIN};
  }
  if (n == 0) {
    nanosleep(&(struct timespec){0, 20000000}, NULL);
    return;
  }
  if (poll(run->fds, (nfds_t)n, 100) <= 0) return;
  for (int i = 0, k = 0; i < run->nchild * 2; i++) {
    tf_relay *r = &run->relays[i];
    if (r->fd < 0) continue;
    if (run->fds[k++].revents && !tf_relay_read(r)) {
      close(r->fd);
      r->fd = -1;
      run->open_fds--;
    }
  }
}

/* Collects the children that ended, remembering the first that failed. */
static void tf_launch_reap(tf_run *run) {
  for (int i = 0; i < run->nchild; i++) {
    int status;
    if (run->pids[i] > 0 && waitpid(run->pids[i], &status, WNOHANG) == run->pids[i]) {
      run->pids[i] = 0;
      run->running--;
      run->codes[i] = tf_exit_code_of(status);
      if (run->codes[i] != TF_EXIT_OK && run->first_failed < 0) {
        run->first_failed = i;
        run->first_code = run->codes[i];
      }
    }
  }
}

static void tf_launch_signal_all(tf_run *run, int sig) {
  for (int i = 0; i < run->nchild; i++)
    if (run->pids[i] > 0) kill(run->pids[i], sig);
}

/* A signal to the launcher or a failed rank stops the others: SIGTERM
 * (Ctrl-C passed on as SIGINT), SIGKILL 5 s later. */
static void tf_launch_stop(tf_run *run) {
  if (tf_launch_signal && !run->interrupted) {
    run->interrupted = true;
    tf_launch_signal_all(run, tf_launch_signal == SIGINT ? SIGINT : SIGTERM);
    run->stop_at = tf_ms_now();
  }
  if (run->first_failed >= 0 && run->stop_at == 0 && run->running > 0) {
    tf_launch_signal_all(run, SIGTERM);
    run->stop_at = tf_ms_now();
  }
  if (run->stop_at && run->running > 0 && tf_ms_now() - run->stop_at > 5000) tf_launch_signal_all(run, SIGKILL);
}

/* Until every child ended and its streams closed; a rank's descendants may
 * hold its pipes open, so relaying stops 2 s after the last child ended. */
static void tf_launch_wait(tf_run *run) {
  while (run->running > 0 || run->open_fds > 0) {
    tf_launch_relay(run);
    tf_launch_reap(run);
    tf_launch_stop(run);
    if (run->running == 0 && run->open_fds > 0) {
      if (!run->ended_at) run->ended_at = tf_ms_now();
      if (tf_ms_now() - run->ended_at > 2000) break;
    }
  }
}

/* The run's exit code, after saying which rank failed and how. */
static int tf_launch_result(const tf_run *run) {
  if (run->interrupted) {
    fprintf(stderr, "tfhost: interrupted; every rank was stopped\n");
    return TF_EXIT_SIGNAL + tf_launch_signal;
  }
  if (run->use_mpirun) {
    const int code = run->codes[0];
    if (code != TF_EXIT_OK) {
      int sig;
      int rank = tf_mpirun_failed_rank(&sig);
      if (rank >= 0 && sig)
        fprintf(stderr, "tfhost: rank %d failed (signal %d); every rank was stopped\n", rank, sig);
      else if (rank >= 0)
        fprintf(stderr, "tfhost: rank %d failed (exit code %d); every rank was stopped\n", rank, code);
      else if (tf_mpirun_said_len)
        fputs(tf_mpirun_said, stderr);
      else
        fprintf(stderr, "tfhost: the run failed (mpirun's exit code %d)\n", code);
    }
    return code;
  }
  if (run->first_failed < 0) return TF_EXIT_OK;
  const int code = run->first_code;
  const bool signalled = code > TF_EXIT_SIGNAL;
  fprintf(stderr, "tfhost: rank %d failed (%s %d); every rank was stopped\n", run->first_failed,
          signalled ? "signal" : "exit code", signalled ? code - TF_EXIT_SIGNAL : code);
  return code;
}

int tf_launch(int nproc, int argc, char **argv) {
  int code = tf_launch_check(nproc);
  if (code != TF_EXIT_OK) return code;
  tf_launch_env(nproc);
  tf_run run = {.nproc = nproc};
  if (!tf_launch_command(&run, argc, argv)) {
    fprintf(stderr, "tfhost: --nproc: out of memory\n");
    return TF_EXIT_SCRIPT;
  }
  tf_launch_catch_signals();
  if (tf_launch_spawn(&run)) {
    tf_launch_wait(&run);
    code = tf_launch_result(&run);
  } else {
    code = TF_EXIT_SCRIPT;
  }
  tf_run_free(&run);
  return code;
}
