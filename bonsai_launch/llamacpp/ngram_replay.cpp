// ngram-replay: what llama-server's draft-free speculation would have drafted and had accepted
// on a token stream it generated greedily, computed by the pin's own common/speculative.cpp.
//
// At temperature 0 a verify step accepts the longest prefix of the draft that equals the tokens
// the target produces next, so an n-gram drafter's counts on a stream are a pure function of
// that stream. This program runs the server's loop (tools/server/server-context.cpp,
// handle_last_sampled_token and the verify that follows) without a model: begin() with the
// prompt, then per step a draft capped at the server's limit, the accepted prefix, accept().
// One common_speculative lives for the whole input, as in a server with one slot, so state
// that carries over between requests (ngram-mod's shared table, ngram-map's per-slot keys)
// carries over here too.
//
// Compiled by bonsai against the build's own static libraries (bonsai_launch/llamacpp/replay.py),
// not a patch. Arguments: the server's speculative flags (--spec-type A[,B], --spec-ngram-*),
// nothing else. Input on stdin, whitespace-separated integers, per request:
//     n_prompt n_generated n_predict n_ctx  prompt tokens...  generated tokens...
// (n_predict -1: no length limit; n_ctx 0: no context limit). Output per request, one line:
//     plain_steps spec_steps drafted accepted : d1,a1 d2,a2 ...
// (a plain step decodes one token; a speculative step verifies a draft of d tokens and keeps a).

#include "common.h"
#include "log.h"
#include "speculative.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static int usage(const char * why) {
    fprintf(stderr, "ngram-replay: %s\n", why);
    return 2;
}

static bool int_arg(int argc, char ** argv, int & i, int & out) {
    if (i + 1 >= argc) {
        return false;
    }
    char * end = nullptr;
    long v = strtol(argv[++i], &end, 10);
    if (end == argv[i] || *end != '\0') {
        return false;
    }
    out = (int) v;
    return true;
}

int main(int argc, char ** argv) {
    common_params_speculative spec;
    std::vector<std::string> names;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        int v = 0;
        if (a == "--spec-type" && i + 1 < argc) {
            std::stringstream ss(argv[++i]);
            std::string name;
            while (std::getline(ss, name, ',')) {
                names.push_back(name);
            }
            continue;
        }
        const bool is_int = a.rfind("--spec-ngram-", 0) == 0;
        if (!is_int || !int_arg(argc, argv, i, v)) {
            return usage(("unknown or incomplete argument " + a).c_str());
        }
        if      (a == "--spec-ngram-mod-n-min")        spec.ngram_mod.n_min = v;
        else if (a == "--spec-ngram-mod-n-max")        spec.ngram_mod.n_max = v;
        else if (a == "--spec-ngram-mod-n-match")      spec.ngram_mod.n_match = v;
        else if (a == "--spec-ngram-simple-size-n")    spec.ngram_simple.size_n = v;
        else if (a == "--spec-ngram-simple-size-m")    spec.ngram_simple.size_m = v;
        else if (a == "--spec-ngram-simple-min-hits")  spec.ngram_simple.min_hits = v;
        else if (a == "--spec-ngram-map-k-size-n")     spec.ngram_map_k.size_n = v;
        else if (a == "--spec-ngram-map-k-size-m")     spec.ngram_map_k.size_m = v;
        else if (a == "--spec-ngram-map-k-min-hits")   spec.ngram_map_k.min_hits = v;
        else if (a == "--spec-ngram-map-k4v-size-n")   spec.ngram_map_k4v.size_n = v;
        else if (a == "--spec-ngram-map-k4v-size-m")   spec.ngram_map_k4v.size_m = v;
        else if (a == "--spec-ngram-map-k4v-min-hits") spec.ngram_map_k4v.min_hits = v;
        else return usage(("unknown argument " + a).c_str());
    }
    if (names.empty()) {
        return usage("--spec-type is required");
    }
    for (const auto & name : names) {
        if (name.rfind("ngram-", 0) != 0) {
            return usage(("only draft-free types can be replayed, not " + name).c_str());
        }
    }
    try {
        // as arg.cpp does: the types are added to the default list (none)
        auto types = common_speculative_types_from_names(names);
        spec.types.insert(spec.types.end(), types.begin(), types.end());
    } catch (const std::exception & e) {
        return usage(e.what());
    }

    common_log_set_verbosity_thold(-1);  // the drafters' own log lines are not our output
    common_speculative_ptr sp(common_speculative_init(spec, 1));
    if (!sp) {
        return usage("no speculative implementation was created");
    }

    long n_prompt = 0, n_gen = 0, n_predict = 0, n_ctx = 0;
    while (std::cin >> n_prompt >> n_gen >> n_predict >> n_ctx) {
        if (n_prompt < 0 || n_gen < 0) {
            return usage("negative token count");
        }
        llama_tokens prompt(n_prompt), gen(n_gen);
        for (auto & t : prompt) {
            if (!(std::cin >> t)) return usage("input ended inside a prompt");
        }
        for (auto & t : gen) {
            if (!(std::cin >> t)) return usage("input ended inside a generation");
        }
        long plain = 0, steps = 0, drafted = 0, accepted = 0;
        std::ostringstream per_step;
        if (n_gen > 0) {
            // the server: prompt evaluated, first token sampled (n_gen = 1), then begin()
            llama_tokens ctx = prompt;
            common_speculative_begin(sp.get(), 0, ctx);
            llama_token sampled = gen[0];
            size_t next = 1;  // index in gen of the next token the target produces
            llama_tokens draft;
            while (next < gen.size()) {
                // server_slot::get_n_draft_max: room in the context, and n_remaining - 1
                long n_max = n_ctx > 0 ? n_ctx - (long) ctx.size() - 2 : 1L << 30;
                const long remaining = n_predict >= 0 ? n_predict - (long) next : -1;
                if (remaining > 0) {
                    n_max = std::min(n_max, remaining - 1);
                }
                draft.clear();
                if (n_max > 0) {
                    auto & dp = common_speculative_get_draft_params(sp.get(), 0);
                    dp = {};
                    dp.drafting = true;
                    dp.n_max = (int32_t) n_max;
                    dp.pos0 = (llama_pos) ctx.size();
                    dp.id_last = sampled;
                    dp.prompt = &ctx;
                    dp.result = &draft;
                    dp.temp = 0.0f;
                    common_speculative_draft(sp.get());
                }
                if (draft.empty()) {  // a plain decode step
                    ctx.push_back(sampled);
                    sampled = gen[next++];
                    plain++;
                    continue;
                }
                size_t a = 0;
                while (a < draft.size() && next + a < gen.size() && draft[a] == gen[next + a]) {
                    a++;
                }
                common_speculative_accept(sp.get(), 0, (uint16_t) a);
                steps++;
                drafted += (long) draft.size();
                accepted += (long) a;
                per_step << ' ' << draft.size() << ',' << a;
                ctx.push_back(sampled);
                ctx.insert(ctx.end(), draft.begin(), draft.begin() + a);
                if (next + a >= gen.size()) {  // the stream ended inside the accepted draft
                    break;
                }
                sampled = gen[next + a];
                next += a + 1;
            }
        }
        std::cout << plain << ' ' << steps << ' ' << drafted << ' ' << accepted << " :" << per_step.str() << '\n';
        std::cout.flush();
    }
    return 0;
}
