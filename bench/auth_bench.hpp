// bench_comm --auth: what a job secret costs the rendezvous store (comm/store.hpp, store_auth):
// HMAC-SHA256 and AES-256-GCM (seal and open) throughput on one core beside memcpy of the same
// buffer, and the time of a store
// request over loopback (set + check, the calls rendezvous, heartbeats and rosters make) without
// a secret, with one (each request and reply MAC'd), and of opening an authenticated connection.
#pragma once
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "codec_bench.hpp"
#include "gasloc/comm/store.hpp"
#include "gasloc/core/secret.hpp"

namespace gasloc::bench {

inline void run_auth_bench(int reps) {
  fmt::print("bench_comm --auth: one thread ({} cores here), median of {} after a warm-up\n\n",
             std::thread::hardware_concurrency(), reps);
  fmt::print("| bytes | memcpy GB/s | HMAC-SHA256 GB/s | HMAC / memcpy time | AES-256-GCM seal GB/s | open GB/s | seal / memcpy time |\n"
             "|---|---|---|---|---|---|---|\n");
  const std::string key = crypto::random_bytes(32);
  for (size_t n : {size_t{64}, size_t{4096}, size_t{1} << 20, size_t{64} << 20}) {
    const std::string x(n, 'x');
    std::string y(n, '\0');
    const int inner = n < 65536 ? 20000 : n < (8u << 20) ? 50 : 2;  // calls a timing, so small ones are measurable
    const double t_copy = median_seconds(reps, [&] {
                            for (int i = 0; i < inner; ++i) {
                              std::memcpy(y.data(), x.data(), n);
                              asm volatile("" ::: "memory");
                            }
                          }) / inner;
    const double t_mac = median_seconds(reps, [&] {
                           for (int i = 0; i < inner; ++i) crypto::hmac_sha256(key, x);
                         }) / inner;
    // A sealed channel's message (core/sealed_channel.hpp): one key, a fresh nonce each, a small header.
    const std::string gcm_key = crypto::random_bytes(32), nonce = crypto::random_bytes(12);
    const std::vector<uint8_t> plain(x.begin(), x.end()), header(16, 1);
    std::vector<uint8_t> sealed(n + crypto::kGcmTagBytes), opened(n);
    const double t_seal = median_seconds(reps, [&] {
                            for (int i = 0; i < inner; ++i) crypto::aes256gcm_seal(gcm_key, nonce, header, plain, sealed);
                          }) / inner;
    bool all_opened = true;
    const double t_open = median_seconds(reps, [&] {
                            for (int i = 0; i < inner; ++i)
                              all_opened = crypto::aes256gcm_open(gcm_key, nonce, header, sealed, opened) && all_opened;
                          }) / inner;
    if (!all_opened || opened != plain) throw Error("bench_comm --auth: a sealed buffer did not open to what was sealed");
    fmt::print("| {} | {:.2f} | {:.3f} | {:.0f}x | {:.3f} | {:.3f} | {:.1f}x |\n", n, n / t_copy / 1e9, n / t_mac / 1e9,
               t_mac / t_copy, n / t_seal / 1e9, n / t_open / 1e9, t_seal / t_copy);
    std::fflush(stdout);
  }
  fmt::print("\n| store over loopback | us a request (set or check) | us to connect |\n|---|---|---|\n");
  const std::string secret = crypto::random_bytes(32);
  for (const bool with_secret : {false, true}) {
    const comm::JobIdentity job{"bench", "bench_comm --auth", with_secret ? secret : std::string()};
    comm::StoreServer server({"127.0.0.1", 0, false, job});
    const int requests = 2000;
    const double t_connect =
        median_seconds(reps, [&] { comm::StoreClient("127.0.0.1", server.port(), std::chrono::seconds(10), job); });
    comm::StoreClient client("127.0.0.1", server.port(), std::chrono::seconds(10), job);
    const std::vector<uint8_t> value(64, 7);
    const double t_req = median_seconds(reps, [&] {
                           for (int i = 0; i < requests / 2; ++i) {
                             client.set("k", value);
                             client.check({"k"});
                           }
                         }) / requests;
    fmt::print("| {} | {:.1f} | {:.0f} |\n", with_secret ? "with a secret" : "without a secret", t_req * 1e6,
               t_connect * 1e6);
    std::fflush(stdout);
  }
}

}  // namespace gasloc::bench
