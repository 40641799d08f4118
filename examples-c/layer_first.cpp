// examples-c/layer_first.cpp: a C++ engine that keeps its KV in a layer-first pool (one
// allocation per layer for K and one for V, as many serving stacks do) offloads pages to
// kvtier and brings them back through ranges, with no staging copy.
//
//   c++ -std=c++17 -Iinclude examples-c/layer_first.cpp -Ltarget/release -lkvtier -o layer_first
//
// A page's object is its K and V bytes of every layer, in layer order: 2 x LAYERS ranges.
// The program stores PAGES pages from one pool, loads them into other pages of a second
// pool (as another engine would), and exits 0 only when every byte matches. The store is a
// local directory (argv[1], or a temporary one), or the JSON store section in
// KVT_EXAMPLE_STORE (ffi-tests/on_s3_servers.py runs it on s3s-fs, moto and Ceph RGW).
#include "kvtier.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

constexpr std::size_t LAYERS = 32;
constexpr std::size_t PAGES = 8;
// Bytes of one layer's K (or V) for one page: e.g. 16 tokens x 8 heads x 128 dims x bf16.
constexpr std::size_t PAGE_BYTES = 16 * 8 * 128 * 2;

// The engine's pool: per layer, a K and a V allocation of PAGES pages each.
struct LayerFirstPool {
    std::vector<std::vector<std::uint8_t>> k, v;
    std::vector<std::uint64_t> k_regions, v_regions;

    explicit LayerFirstPool(std::uint32_t seed) : k(LAYERS), v(LAYERS)
    {
        std::uint32_t x = seed * 2654435761u + 1;
        for (std::size_t l = 0; l < LAYERS; l++) {
            k[l].resize(PAGES * PAGE_BYTES);
            v[l].resize(PAGES * PAGE_BYTES);
            for (auto *layer : {&k[l], &v[l]}) {
                for (auto &b : *layer) {
                    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
                    b = seed == 0 ? 0 : static_cast<std::uint8_t>(x);
                }
            }
        }
    }

    // Each allocation becomes a region of the tier; the pool must outlive the tier (or
    // its regions' removal).
    void register_with(kvtier::Tier &tier)
    {
        for (std::size_t l = 0; l < LAYERS; l++) {
            k_regions.push_back(tier.add_region(k[l].data(), k[l].size()));
            v_regions.push_back(tier.add_region(v[l].data(), v[l].size()));
        }
    }

    // The ranges of `page`, appended to `out`: layer 0's K and V, layer 1's, ...
    void page_ranges(std::size_t page, std::vector<kvtier::Range> &out) const
    {
        for (std::size_t l = 0; l < LAYERS; l++) {
            out.push_back({k_regions[l], page * PAGE_BYTES, PAGE_BYTES});
            out.push_back({v_regions[l], page * PAGE_BYTES, PAGE_BYTES});
        }
    }

    bool same_page(std::size_t page, const LayerFirstPool &other, std::size_t other_page) const
    {
        for (std::size_t l = 0; l < LAYERS; l++) {
            for (auto pair : {std::make_pair(&k[l], &other.k[l]), std::make_pair(&v[l], &other.v[l])}) {
                if (std::memcmp(pair.first->data() + page * PAGE_BYTES, pair.second->data() + other_page * PAGE_BYTES,
                                PAGE_BYTES) != 0) {
                    return false;
                }
            }
        }
        return true;
    }
};

// A page's key: a 32-byte hash (here a counter) and a 4-byte group index.
std::vector<std::uint8_t> page_keys(std::size_t n)
{
    std::vector<std::uint8_t> keys(n * KVT_DEFAULT_KEY_BYTES, 0);
    for (std::size_t i = 0; i < n; i++) {
        keys[i * KVT_DEFAULT_KEY_BYTES] = 0x1f;
        keys[i * KVT_DEFAULT_KEY_BYTES + 1] = static_cast<std::uint8_t>(i + 1);
    }
    return keys;
}

// Waits for one job's result; true when it succeeded.
bool wait_for(kvtier::Tier &tier, std::uint64_t job_id)
{
    tier.drain(std::chrono::seconds(30));
    for (const kvtier::Result &r : tier.poll()) {
        std::printf("job %llu: %s, %llu bytes in %.3f s %s\n", static_cast<unsigned long long>(r.job_id),
                    r.ok() ? "ok" : "FAILED", static_cast<unsigned long long>(r.bytes), r.seconds, r.message.c_str());
        if (r.job_id == job_id) {
            return r.ok();
        }
    }
    return false;
}

} // namespace

int main(int argc, char **argv)
{
    // The store: a JSON store section in KVT_EXAMPLE_STORE (an S3 server, say), else a
    // local directory (argv[1], or a temporary one).
    const char *store = std::getenv("KVT_EXAMPLE_STORE");
    std::string dir = argc > 1 ? argv[1] : "";
    char tmpl[] = "/tmp/kvtier-layer-first-XXXXXX";
    std::string config;
    if (store != nullptr && *store != '\0') {
        config = std::string(R"({"store":)") + store + R"(,"prefix":"layer-first-)" + std::to_string(getpid()) + R"("})";
    } else {
        if (dir.empty()) {
            if (mkdtemp(tmpl) == nullptr) {
                std::perror("mkdtemp");
                return 1;
            }
            dir = tmpl;
        }
        config = R"({"store":{"type":"local","path":")" + dir + R"("},"prefix":"kv"})";
    }
    try {
        const std::vector<std::uint8_t> keys = page_keys(PAGES);
        LayerFirstPool source(7), target(0);
        {
            kvtier::Tier writer(config);
            source.register_with(writer);
            std::vector<kvtier::Range> ranges;
            for (std::size_t p = 0; p < PAGES; p++) {
                source.page_ranges(p, ranges);
            }
            writer.submit_store_ranges(1, ranges, 2 * LAYERS, keys);
            if (!wait_for(writer, 1)) {
                return 1;
            }
        }
        // Another engine (here a second tier) loads page p's key into page PAGES-1-p.
        kvtier::Tier reader(config);
        target.register_with(reader);
        std::vector<kvtier::Range> ranges;
        for (std::size_t p = 0; p < PAGES; p++) {
            target.page_ranges(PAGES - 1 - p, ranges);
        }
        reader.submit_load_ranges(2, ranges, 2 * LAYERS, keys);
        if (!wait_for(reader, 2)) {
            return 1;
        }
        for (std::size_t p = 0; p < PAGES; p++) {
            if (!source.same_page(p, target, PAGES - 1 - p)) {
                std::fprintf(stderr, "page %zu differs after the round trip\n", p);
                return 1;
            }
        }
        std::printf("%zu pages of %zu ranges restored byte-exact\n", PAGES, 2 * LAYERS);
    } catch (const kvtier::Error &e) {
        std::fprintf(stderr, "kvtier: %s\n", e.what());
        return 1;
    }
    if (argc <= 1 && (store == nullptr || *store == '\0')) {
        std::system(("rm -rf '" + dir + "'").c_str());
    }
    return 0;
}
