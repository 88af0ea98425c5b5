/* whale serve's streamed pieces: the tool-call parser fed byte by byte (as
 * a slow model writes) and all at once, and the logprobs of a logits row
 * against a log-softmax computed here in long double. Also serve_open's
 * refusals of a configuration out of range, before it loads anything. */
#include "serve/serve_impl.h"
#include "testutil.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(cond) CHECK(cond, "in %s", __func__)

typedef struct {
    char text[512], args[8][256], name[8][64];
    int n_text, n_args_pieces[8], calls, pieces, order_ok;
} got_t;

static void take(serve_toolstream *t, int done, got_t *g) {
    serve_tool_piece p;
    while (serve_toolstream_next(t, done, &p) == 1) {
        g->pieces++;
        if (p.kind == SERVE_PIECE_TEXT) {
            memcpy(g->text + g->n_text, p.p, p.n);
            g->n_text += (int)p.n;
        } else if (p.kind == SERVE_PIECE_CALL) {
            g->order_ok &= p.index == g->calls;
            snprintf(g->name[p.index], sizeof g->name[0], "%s", p.name);
            g->calls++;
        } else {
            g->order_ok &= p.index == g->calls - 1;
            strncat(g->args[p.index], p.p, p.n);
            g->n_args_pieces[p.index]++;
        }
    }
}

/* Feed reply in steps of `step` bytes (0: all at once), then finish. */
static got_t run(const char *reply, size_t step) {
    got_t g;
    memset(&g, 0, sizeof g);
    g.order_ok = 1;
    serve_toolstream *t = serve_toolstream_new();
    size_t n = strlen(reply);
    for (size_t at = 0; at < n; at += step ? step : n) {
        size_t k = step && at + step < n ? step : n - at;
        EXPECT(serve_toolstream_feed(t, reply + at, k) == 0);
        take(t, 0, &g);
    }
    take(t, 1, &g);
    EXPECT(serve_toolstream_calls(t) == g.calls);
    EXPECT(serve_toolstream_consumed(t) <= n);
    serve_toolstream_free(t);
    return g;
}

static void test_hermes(void) {
    const char *reply = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                        "\"n\": [1, {\"x\": \"}\\\"{\"}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
                        "\"arguments\": {}}\n</tool_call>\n";
    for (size_t step = 0; step <= 1; step++) {
        got_t g = run(reply, step);
        EXPECT(g.order_ok);
        EXPECT(g.calls == 2);
        EXPECT(!strcmp(g.text, "Let me check.\n")); /* the whitespace between and after the calls is dropped */
        EXPECT(!strcmp(g.name[0], "get_weather") && !strcmp(g.name[1], "get_time"));
        EXPECT(!strcmp(g.args[0], "{\"city\": \"Paris\", \"n\": [1, {\"x\": \"}\\\"{\"}]}"));
        EXPECT(!strcmp(g.args[1], "{}"));
        /* byte by byte, the arguments go out as they arrive: one piece per byte */
        if (step == 1) EXPECT(g.n_args_pieces[0] == (int)strlen(g.args[0]));
        if (step == 0) EXPECT(g.n_args_pieces[0] == 1);
    }
}

/* The call is announced as soon as its head has arrived, before its arguments. */
static void test_announce_early(void) {
    serve_toolstream *t = serve_toolstream_new();
    got_t g;
    memset(&g, 0, sizeof g);
    g.order_ok = 1;
    const char *head = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ";
    EXPECT(serve_toolstream_feed(t, head, strlen(head)) == 0);
    take(t, 0, &g);
    EXPECT(g.calls == 1 && !strcmp(g.name[0], "f") && !strcmp(g.args[0], "{\"a\": "));
    serve_toolstream_free(t);
}

static void test_malformed(void) {
    /* a head cut short, a block never closed, an unparsable block: all text, as the whole-reply parser has it */
    const char *cut[] = {"<tool_call>\n{\"name\": \"", "<tool_call>\n{\"arguments\": 1, \"name\": \"f\"",
                         "<tool_call>\n{\"name\": 5}\n</tool_call>", "Hi <tool_call>{oops</tool_call>"};
    for (int i = 0; i < 4; i++)
        for (size_t step = 0; step <= 1; step++) {
            got_t g = run(cut[i], step);
            EXPECT(g.calls == 0);
            EXPECT(!strcmp(g.text, cut[i]));
        }
}

static void test_other_shapes(void) {
    /* another key order: held to the block's end, parsed whole */
    got_t g = run("<tool_call>{\"arguments\": {\"q\": \"x\"}, \"name\": \"search\"}</tool_call>", 1);
    EXPECT(g.calls == 1 && !strcmp(g.name[0], "search") && !strcmp(g.args[0], "{\"q\":\"x\"}") && g.text[0] == 0);
    /* Llama 3.1: a reply that is one JSON call */
    g = run("<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}", 1);
    EXPECT(g.calls == 1 && !strcmp(g.name[0], "f") && !strcmp(g.args[0], "{\"a\":1}"));
    g = run("{\"answer\": 42}", 1); /* JSON that is no call: text */
    EXPECT(g.calls == 0 && !strcmp(g.text, "{\"answer\": 42}"));
}

static void test_text(void) {
    /* plain text streams as it comes; a tail that might open a call waits for the next bytes */
    got_t g = run("Tools like <tool are fine, <tool_cal too.", 1);
    EXPECT(g.calls == 0 && !strcmp(g.text, "Tools like <tool are fine, <tool_cal too."));
    EXPECT(g.pieces > 20);
    serve_toolstream *t = serve_toolstream_new();
    memset(&g, 0, sizeof g);
    EXPECT(serve_toolstream_feed(t, "ab<tool_", 8) == 0);
    take(t, 0, &g);
    EXPECT(!strcmp(g.text, "ab")); /* "<tool_" held */
    take(t, 1, &g);
    EXPECT(!strcmp(g.text, "ab<tool_"));
    serve_toolstream_free(t);
}

static void test_logprobs(void) {
    enum { V = 64, K = 5 };
    float row[V];
    uint64_t s = 12345;
    for (int v = 0; v < V; v++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        row[v] = (float)((double)(s >> 40) / (double)(1 << 24) * 8.0 - 4.0);
    }
    row[7] = row[9] = 5.0f; /* a tie at the top: the lower id first */
    row[3] = NAN;           /* counts as -inf */
    row[4] = -INFINITY;
    long double sum = 0, mx = 5.0L;
    for (int v = 0; v < V; v++)
        if (v != 3 && v != 4) sum += expl((long double)row[v] - mx);
    long double lse = mx + logl(sum);
    serve_lp out, top[K];
    for (int id = 0; id < V; id++) {
        serve_logprobs_row(row, V, id, K, &out, top);
        long double want = id == 3 || id == 4 ? -9999.0L : (long double)row[id] - lse;
        EXPECT(out.id == id);
        EXPECT(fabsl((long double)out.logprob - want) < 1e-5L);
    }
    EXPECT(top[0].id == 7 && top[1].id == 9 && top[0].logprob == top[1].logprob);
    for (int k = 1; k < K; k++) EXPECT(top[k].logprob <= top[k - 1].logprob);
    for (int v = 0; v < V; v++) /* nothing outside the top is above its last */
        if (v != 3 && v != 4 && (long double)row[v] - lse > (long double)top[K - 1].logprob + 1e-6L) {
            int in = 0;
            for (int k = 0; k < K; k++) in |= top[k].id == v;
            EXPECT(in);
        }
}

/* serve_open with one field out of range: WHALE_ERR_ARG naming the
 * option, nothing opened; a folder that holds no model: its error, the
 * folder named, nothing opened (and, under the sanitizers, nothing kept). */
static void test_config_refused(void) {
    static const struct {
        size_t field; /* an int of serve_config */
        const char *says;
        int value;
    } bad[] = {
        {offsetof(serve_config, parallel), "--parallel", 0},
        {offsetof(serve_config, parallel), "--parallel", 1025},
        {offsetof(serve_config, stream_interval), "--stream-interval", 0},
        {offsetof(serve_config, stream_interval), "--stream-interval", 1025},
        {offsetof(serve_config, port), "--port", -1},
        {offsetof(serve_config, port), "--port", 65536},
        {offsetof(serve_config, queue), "--queue", -1},
        {offsetof(serve_config, n_adapters), "--adapters", SERVE_MAX_ADAPTERS + 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        serve_config c = serve_config_defaults();
        c.model_dir = "no-such-model";
        *(int *)((char *)&c + bad[i].field) = bad[i].value;
        serve_server *s = (serve_server *)&c; /* must come back NULL */
        whale_err err = {0};
        whale_code rc = serve_open(&c, &s, &err);
        CHECK(rc == WHALE_ERR_ARG && !s && strstr(err.msg, bad[i].says), "%s %d: code %d, \"%s\"", bad[i].says,
              bad[i].value, (int)rc, err.msg);
    }
    serve_config c = serve_config_defaults();
    serve_server *s = (serve_server *)&c;
    whale_err err = {0};
    whale_code rc = serve_open(&c, &s, &err);
    CHECK(rc == WHALE_ERR_ARG && !s && strstr(err.msg, "model folder"), "no model folder: code %d, \"%s\"", (int)rc,
          err.msg);
    c.model_dir = "no-such-model";
    rc = serve_open(&c, &s, &err);
    CHECK(rc != WHALE_OK && !s && strstr(err.msg, "no-such-model"), "missing folder: code %d, \"%s\"", (int)rc,
          err.msg);
}

int main(void) {
    test_config_refused();
    test_hermes();
    test_announce_early();
    test_malformed();
    test_other_shapes();
    test_text();
    test_logprobs();
    return test_finish("test_serve_stream");
}
