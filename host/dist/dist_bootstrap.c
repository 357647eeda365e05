/* NCCL's unique id from rank 0 to the others without MPI (tfhost --nproc
 * in a build without MPI, torchrun-style environments): rank 0 listens on
 * MASTER_ADDR:MASTER_PORT + 1 and writes the bytes to each rank that
 * connects; the others connect, retrying while rank 0 starts, and read. */
#include "dist_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

static bool tf_io_all(int fd, void *buf, size_t n, bool writing) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = writing ? write(fd, p, n) : read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= (size_t)k;
  }
  return true;
}

tf_status tf_dist_tcp_bcast(const tf_dist_env *env, void *data, size_t n, double timeout) {
  const char *addr = getenv("MASTER_ADDR"), *port_s = getenv("MASTER_PORT");
  if (!addr || !port_s)
    return tf_fail(TF_ERR_STATE, "tf.dist: NCCL's id goes from rank 0 to the others over MASTER_ADDR:MASTER_PORT, "
                                 "and they are not set (tfhost --nproc sets them; so does torchrun)");
  int port = atoi(port_s) + 1;
  if (port <= 1 || port > 65535) return tf_fail(TF_ERR_ARG, "tf.dist: MASTER_PORT='%s' is not a port", port_s);
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = env->rank == 0 ? AI_PASSIVE : 0};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(env->rank == 0 ? NULL : addr, service, &hints, &res);
  if (rc != 0) return tf_fail(TF_ERR_BACKEND, "tf.dist: cannot resolve %s: %s", addr, gai_strerror(rc));
  const int64_t deadline = tf_clock_ns() + (int64_t)(timeout * 1e9);
  tf_status st = TF_OK;
  if (env->rank == 0) {
    int fd = socket(res->ai_family, SOCK_STREAM, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, env->world_size) != 0) {
      st = tf_fail(TF_ERR_BACKEND, "tf.dist: rank 0 cannot listen on port %d: %s", port, strerror(errno));
    }
    for (int served = 1; st == TF_OK && served < env->world_size; served++) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      int left_ms = (int)((deadline - tf_clock_ns()) / 1000000);
      if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0) {
        st = tf_fail(TF_ERR_STATE, "tf.dist: only %d of %d ranks connected to rank 0 within %.0f s", served,
                     env->world_size, timeout);
        break;
      }
      int c = accept(fd, NULL, NULL);
      if (c < 0 || !tf_io_all(c, data, n, true))
        st = tf_fail(TF_ERR_BACKEND, "tf.dist: sending NCCL's id failed: %s", strerror(errno));
      if (c >= 0) close(c);
    }
    if (fd >= 0) close(fd);
  } else {
    for (;;) {
      int fd = socket(res->ai_family, SOCK_STREAM, 0);
      if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        if (!tf_io_all(fd, data, n, false))
          st = tf_fail(TF_ERR_BACKEND, "tf.dist: reading NCCL's id from rank 0 failed");
        close(fd);
        break;
      }
      if (fd >= 0) close(fd);
      if (tf_clock_ns() > deadline) {
        st = tf_fail(TF_ERR_STATE, "tf.dist: rank %d could not reach rank 0 at %s:%d within %.0f s", env->rank, addr,
                     port, timeout);
        break;
      }
      nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
  }
  freeaddrinfo(res);
  return st;
}
