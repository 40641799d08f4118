/*
 * bench/socket_floor.c: the raw loopback floor. One process sends `--bytes` over a plain
 * TCP connection on 127.0.0.1 from a pre-faulted pool, block by block (`--block-size`
 * per send() call, walking through a `--pool-mib` pool as a tier walks its host pool);
 * a forked process receives them into a pre-faulted pool of the same size with
 * recv(MSG_WAITALL) per block. Each side measures its own CPU with
 * getrusage(RUSAGE_SELF) over the transfer only. Prints one JSON line:
 * send_cpu_s_per_gib, recv_cpu_s_per_gib, mib_s.
 *
 * This is the least CPU any client can spend to move the bytes through the kernel
 * (one user->kernel copy to send, one kernel->user copy to receive): the floor that
 * kvtier's CPU-s/GiB on the sink is compared with.
 *
 *   cc -O2 -o target/bench/socket_floor bench/socket_floor.c
 *   socket_floor --bytes 2G --block-size 2M --pool-mib 256
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

static double cpu_s(void)
{
    double user, sys;
    rusage_s(&user, &sys);
    return user + sys;
}

static void fail(const char *what)
{
    perror(what);
    exit(2);
}

static unsigned char *prefaulted(size_t bytes, int fill)
{
    unsigned char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        fail("mmap");
    for (size_t i = 0; i < bytes; i++)
        p[i] = (unsigned char)(fill ? i * 131 + 7 : 0xA5);
    return p;
}

int main(int argc, char **argv)
{
    size_t total = 2ull << 30, block = 2 << 20, pool_bytes = 256u << 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bytes")) total = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "--block-size")) block = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "--pool-mib")) pool_bytes = parse_size(argv[i + 1]) << 20;
        else { fprintf(stderr, "usage: socket_floor [--bytes 2G] [--block-size 2M] [--pool-mib 256]\n"); return 2; }
    }
    if (pool_bytes < block)
        pool_bytes = block;
    size_t blocks_in_pool = pool_bytes / block;
    size_t nblocks = (total + block - 1) / block;

    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof addr;
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) || listen(ls, 1) || getsockname(ls, (struct sockaddr *)&addr, &alen))
        fail("listen");
    int pipefd[2];
    if (pipe(pipefd))
        fail("pipe");

    pid_t pid = fork();
    if (pid < 0)
        fail("fork");
    if (pid == 0) { /* receiver */
        close(ls);
        unsigned char *pool = prefaulted(blocks_in_pool * block, 0);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(s, (struct sockaddr *)&addr, sizeof addr))
            fail("connect");
        char go = 1;
        if (write(s, &go, 1) != 1)
            fail("write");
        double c0 = cpu_s();
        for (size_t b = 0; b < nblocks; b++) {
            unsigned char *dst = pool + (b % blocks_in_pool) * block;
            size_t got = 0;
            while (got < block) {
                ssize_t r = recv(s, dst + got, block - got, MSG_WAITALL);
                if (r <= 0)
                    fail("recv");
                got += (size_t)r;
            }
        }
        double c = cpu_s() - c0;
        if (write(pipefd[1], &c, sizeof c) != sizeof c)
            fail("pipe write");
        _exit(0);
    }
    unsigned char *pool = prefaulted(blocks_in_pool * block, 1);
    int s = accept(ls, NULL, NULL);
    if (s < 0)
        fail("accept");
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char go;
    if (read(s, &go, 1) != 1)
        fail("read");
    double c0 = cpu_s(), t0 = now_s();
    for (size_t b = 0; b < nblocks; b++) {
        unsigned char *src = pool + (b % blocks_in_pool) * block;
        size_t sent = 0;
        while (sent < block) {
            ssize_t w = send(s, src + sent, block - sent, 0);
            if (w <= 0)
                fail("send");
            sent += (size_t)w;
        }
    }
    double send_cpu = cpu_s() - c0;
    double recv_cpu = 0;
    if (read(pipefd[0], &recv_cpu, sizeof recv_cpu) != sizeof recv_cpu)
        fail("pipe read");
    double wall = now_s() - t0;
    waitpid(pid, NULL, 0);
    double bytes = (double)nblocks * (double)block, gib = bytes / (1024.0 * 1024 * 1024);
    printf("{\"client\":\"socket\",\"block_bytes\":%zu,\"bytes\":%.0f,\"wall_s\":%.6f,\"mib_s\":%.3f,"
           "\"send_cpu_s_per_gib\":%.4f,\"recv_cpu_s_per_gib\":%.4f,\"verified\":true}\n",
           block, bytes, wall, bytes / (1024.0 * 1024) / wall, send_cpu / gib, recv_cpu / gib);
    return 0;
}
