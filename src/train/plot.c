/* whale plot: training curves from metrics.jsonl as a plain SVG line chart.
 *
 * The chart is built in three steps: read every run's points (sorted by step,
 * non-finite values kept as gaps), lay out axes with 1-2-5 ticks around the
 * union of the data, then print the SVG. Long series are thinned to at most
 * four points per pixel column (first, min, max, last), which draws the same
 * picture as the full series at a fraction of the size. */
#define _POSIX_C_SOURCE 200809L
#include "whale_plot.h"

#include "core/core.h"
#include "core/sbuf.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* ------------------------------------------------------------ data */

typedef struct {
    double x, y; /* y is NaN for a gap */
    long line;   /* source line: orders points of equal step */
} plot_pt;

typedef struct {
    plot_pt *p;
    int n, cap;
} plot_series;

typedef struct {
    char *name;
    plot_series s[2];    /* one per plotted key */
    plot_series smooth;  /* moving average of s[0] (empty if none) */
} plot_run;

/* What to draw: up to two keys per run, each as a train-style line or as
 * val-style markers. */
typedef struct {
    const char *key[2];
    int val_style[2];
    int nkeys;
    const char *ylabel;
} plot_spec;

static whale_code series_push(plot_series *s, double x, double y, long line) {
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        plot_pt *p = realloc(s->p, sizeof(plot_pt) * (size_t)cap);
        if (!p) return WHALE_ERR_NOMEM;
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = (plot_pt){x, y, line};
    return WHALE_OK;
}

static int pt_cmp(const void *a, const void *b) {
    const plot_pt *p = a, *q = b;
    if (p->x != q->x) return p->x < q->x ? -1 : 1;
    return (p->line > q->line) - (p->line < q->line);
}

/* Sort by step; for a repeated step (a resumed run logs it again) the later
 * line wins. */
static void series_sort(plot_series *s) {
    int sorted = 1;
    for (int i = 1; i < s->n && sorted; i++) sorted = s->p[i].x > s->p[i - 1].x;
    if (sorted) return;
    qsort(s->p, (size_t)s->n, sizeof(plot_pt), pt_cmp);
    int m = 0;
    for (int i = 0; i < s->n; i++) {
        if (m > 0 && s->p[m - 1].x == s->p[i].x) m--;
        s->p[m++] = s->p[i];
    }
    s->n = m;
}

/* A point the chart can show: finite, and positive on a log axis. */
static int drawable(double y, int log_y) { return isfinite(y) && (!log_y || y > 0); }

static int finite_count(const plot_series *s, int log_y) {
    int n = 0;
    for (int i = 0; i < s->n; i++) n += drawable(s->p[i].y, log_y);
    return n;
}

/* Centered moving average over the points (gaps stay gaps; the window
 * averages the finite values it covers, so it narrows at the ends). */
static whale_code series_smooth(const plot_series *s, int window, int log_y, plot_series *out) {
    int h = window / 2;
    double *sum = malloc(sizeof(double) * ((size_t)s->n + 1));
    int *cnt = malloc(sizeof(int) * ((size_t)s->n + 1));
    out->p = malloc(sizeof(plot_pt) * ((size_t)s->n + 1));
    if (!sum || !cnt || !out->p) {
        free(sum);
        free(cnt);
        return WHALE_ERR_NOMEM;
    }
    sum[0] = 0;
    cnt[0] = 0;
    for (int i = 0; i < s->n; i++) {
        int ok = drawable(s->p[i].y, log_y);
        sum[i + 1] = sum[i] + (ok ? s->p[i].y : 0);
        cnt[i + 1] = cnt[i] + ok;
    }
    for (int i = 0; i < s->n; i++) {
        int a = i - h < 0 ? 0 : i - h, b = i + h + 1 > s->n ? s->n : i + h + 1;
        double y = NAN;
        if (drawable(s->p[i].y, log_y) && cnt[b] > cnt[a]) y = (sum[b] - sum[a]) / (cnt[b] - cnt[a]);
        out->p[i] = (plot_pt){s->p[i].x, y, s->p[i].line};
    }
    out->n = out->cap = s->n;
    free(sum);
    free(cnt);
    return WHALE_OK;
}

/* ------------------------------------------------------------ reading */

/* Copy one line, turning the non-finite literals trainers print (NaN,
 * Infinity, -inf, nan, ...) into null, which strict JSON can hold. */
static void sanitize_line(const char *src, size_t n, char *dst) {
    size_t o = 0;
    int in_str = 0;
    for (size_t i = 0; i < n;) {
        char c = src[i];
        if (in_str) {
            dst[o++] = c;
            if (c == '\\' && i + 1 < n) dst[o++] = src[++i];
            else if (c == '"') in_str = 0;
            i++;
            continue;
        }
        if (c == '"') {
            in_str = 1;
            dst[o++] = src[i++];
            continue;
        }
        size_t j = i + ((c == '-' || c == '+') && i + 1 < n && isalpha((unsigned char)src[i + 1]));
        if (isalpha((unsigned char)src[j])) {
            size_t k = j;
            while (k < n && isalpha((unsigned char)src[k])) k++;
            size_t len = k - j;
            if ((len == 3 && (!strncasecmp(src + j, "nan", 3) || !strncasecmp(src + j, "inf", 3))) ||
                (len == 8 && !strncasecmp(src + j, "infinity", 8))) {
                memcpy(dst + o, "null", 4);
                o += 4;
            } else {
                memcpy(dst + o, src + i, k - i);
                o += k - i;
            }
            i = k;
            continue;
        }
        dst[o++] = src[i++];
    }
    dst[o] = '\0';
}

static const char *last_component(const char *path, size_t *len) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    *len = n - b;
    return path + b;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Legend name: the folder's name, or the file's stem; "metrics.jsonl" given
 * directly is named after its folder too. */
static char *run_name(const char *input, int is_dir) {
    char *real = NULL, *name = NULL;
    size_t len;
    const char *base;
    if (is_dir) {
        real = realpath(input, NULL);
        base = last_component(real ? real : input, &len);
    } else {
        base = last_component(input, &len);
        const char *dot = NULL;
        for (size_t i = 1; i < len; i++)
            if (base[i] == '.') dot = base + i;
        if (dot) len = (size_t)(dot - base);
        if (((len == 7 && !strncmp(base, "metrics", 7)) || (len == 7 && !strncmp(base, "logging", 7))) &&
            (real = realpath(input, NULL)) != NULL) {
            char *slash = strrchr(real, '/');
            if (slash && slash != real) {
                *slash = '\0';
                base = last_component(real, &len);
            }
        }
    }
    if (len == 0 || (len == 1 && base[0] == '/')) base = input, len = strlen(input);
    name = dup_n(base, len);
    free(real);
    return name;
}

/* A line's step: "step", or ms-swift's "global_step/max_steps": "N/M". */
static int line_step(const cJSON *obj, double *step) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "step");
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) return *step = v->valuedouble, 1;
    v = cJSON_GetObjectItemCaseSensitive(obj, "global_step/max_steps");
    char *end;
    if (!cJSON_IsString(v)) return 0;
    *step = strtod(v->valuestring, &end);
    return end != v->valuestring && *end == '/' && isfinite(*step);
}

/* key's value; val_X is also ms-swift's eval_X. */
static const cJSON *line_value(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v || strncmp(key, "val_", 4)) return v;
    char alt[128];
    snprintf(alt, sizeof alt, "eval_%s", key + 4);
    return cJSON_GetObjectItemCaseSensitive(obj, alt);
}

static whale_code read_run(const char *input, const plot_spec *spec, plot_run *run, whale_err *err) {
    struct stat st;
    if (stat(input, &st) != 0) return whale_errf(err, WHALE_ERR_IO, "%s: cannot open: %s", input, strerror(errno));
    int is_dir = S_ISDIR(st.st_mode);
    size_t plen = strlen(input);
    char *path = malloc(plen + 16);
    if (!path) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", input);
    if (is_dir) { /* whale train's metrics.jsonl, or an sft run's logging.jsonl (ms-swift's) */
        snprintf(path, plen + 16, "%s/metrics.jsonl", input);
        if (stat(path, &st) != 0) snprintf(path, plen + 16, "%s/logging.jsonl", input);
    } else memcpy(path, input, plen + 1);
    run->name = run_name(input, is_dir);
    if (!run->name) {
        free(path);
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", input);
    }
    if (is_dir && stat(path, &st) != 0) {
        free(path);
        return whale_errf(err, WHALE_ERR_IO, "%s: no metrics.jsonl or logging.jsonl in this folder", input);
    }
    char *data;
    size_t size;
    whale_code rc = whale_read_file(path, &data, &size, err);
    if (rc) {
        free(path);
        return rc;
    }
    char *buf = malloc(2 * size + 8); /* "inf" -> "null" grows a line by at most 1/3 */
    if (!buf) rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
    long lineno = 0, parsed = 0;
    for (size_t pos = 0; !rc && pos < size;) {
        const char *line = data + pos;
        const char *nl = memchr(line, '\n', size - pos);
        size_t n = nl ? (size_t)(nl - line) : size - pos;
        pos += n + (nl != NULL);
        lineno++;
        while (n > 0 && isspace((unsigned char)line[n - 1])) n--;
        size_t lead = 0;
        while (lead < n && isspace((unsigned char)line[lead])) lead++;
        if (lead == n) continue;
        sanitize_line(line, n, buf);
        cJSON *obj = cJSON_ParseWithOpts(buf, NULL, 1); /* 1: nothing may follow the object */
        if (!obj) {
            /* a trainer may be half-way through writing the last line */
            if (!nl && parsed > 0) break;
            rc = whale_errf(err, WHALE_ERR_FORMAT, "%s:%ld: invalid JSON", path, lineno);
            break;
        }
        parsed++;
        if (!cJSON_IsObject(obj)) {
            cJSON_Delete(obj);
            rc = whale_errf(err, WHALE_ERR_FORMAT, "%s:%ld: not a JSON object", path, lineno);
            break;
        }
        double step;
        int has_step = line_step(obj, &step);
        for (int k = 0; k < spec->nkeys && !rc; k++) {
            const cJSON *v = line_value(obj, spec->key[k]);
            if (!v) continue;
            if (!cJSON_IsNumber(v) && !cJSON_IsNull(v)) {
                rc = whale_errf(err, WHALE_ERR_FORMAT, "%s:%ld: \"%s\" is not a number", path, lineno, spec->key[k]);
            } else if (!has_step) {
                rc = whale_errf(err, WHALE_ERR_FORMAT, "%s:%ld: \"%s\" without a numeric \"step\"", path, lineno,
                                spec->key[k]);
            } else {
                double y = cJSON_IsNumber(v) ? v->valuedouble : NAN;
                if (series_push(&run->s[k], step, y, lineno))
                    rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", path);
            }
        }
        cJSON_Delete(obj);
    }
    if (!rc && parsed == 0) rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: empty file (no metrics)", path);
    free(buf);
    free(data);
    free(path);
    return rc;
}

/* ------------------------------------------------------------ output text */

/* Length in characters of a valid UTF-8 sequence starting at s, or 0. */
static int utf8_len(const unsigned char *s, size_t left) {
    unsigned c = s[0];
    int more = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    if (more < 0 || left <= (size_t)more) return 0;
    for (int k = 1; k <= more; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) ||
        (c == 0xF4 && s[1] > 0x8F))
        return 0;
    return more + 1;
}

/* XML text of at most max_chars characters (an ellipsis marks a cut);
 * control characters and invalid UTF-8, which XML cannot hold, become '?'. */
static void sb_text(whale_sbuf *b, const char *s, int max_chars) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    int chars = 0;
    for (size_t i = 0; i < n;) {
        if (chars == max_chars) {
            whale_sb_printf(b, "\xE2\x80\xA6");
            return;
        }
        int len = utf8_len(u + i, n - i);
        chars++;
        if (len > 1) {
            whale_sb_printf(b, "%.*s", len, s + i);
            i += (size_t)len;
            continue;
        }
        unsigned c = u[i++];
        switch (c) {
        case '&': whale_sb_printf(b, "&amp;"); break;
        case '<': whale_sb_printf(b, "&lt;"); break;
        case '>': whale_sb_printf(b, "&gt;"); break;
        case '"': whale_sb_printf(b, "&quot;"); break;
        default: whale_sb_printf(b, "%c", len == 1 && c >= 0x20 && c != 0x7F ? (char)c : '?');
        }
    }
}

/* Characters the text will show (for width estimates). */
static int text_chars(const char *s, int max_chars) {
    int chars = 0;
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) chars += (*u & 0xC0) != 0x80;
    return chars > max_chars ? max_chars + 1 : chars;
}

/* ------------------------------------------------------------ axes */

#define MAX_TICKS 64

typedef struct {
    int log;
    double lo, hi;   /* axis ends, data units */
    double p0, p1;   /* pixel positions of lo and hi */
    int nticks;
    double tick[MAX_TICKS];
    char label[MAX_TICKS][24];
} plot_axis;

static double axis_t(const plot_axis *a, double v) { return a->log ? log10(v) : v; }

static double axis_px(const plot_axis *a, double v) {
    double t0 = axis_t(a, a->lo), t1 = axis_t(a, a->hi);
    return a->p0 + (axis_t(a, v) - t0) / (t1 - t0) * (a->p1 - a->p0);
}

/* Smallest 1, 2 or 5 times a power of ten that is >= raw. */
static double nice_step(double raw) {
    double e = pow(10, floor(log10(raw)));
    double f = raw / e;
    return (f <= 1 + 1e-9 ? 1 : f <= 2 + 1e-9 ? 2 : f <= 5 + 1e-9 ? 5 : 10) * e;
}

/* "1e-5" rather than printf's "1e-05". */
static void tidy_exponent(char *s) {
    char *e = strchr(s, 'e');
    if (!e) return;
    char *src = e + 1, *dst = e + 1;
    if (*src == '+') src++;
    else if (*src == '-') *dst++ = *src++;
    while (*src == '0' && src[1]) src++;
    memmove(dst, src, strlen(src) + 1);
}

static void strip_zeros(char *s) {
    if (!strchr(s, '.')) return;
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '0') s[--n] = '\0';
    if (n > 0 && s[n - 1] == '.') s[--n] = '\0';
}

/* Labels of a linear axis share one format, chosen from the step: fixed
 * decimals, k/M suffixes for large step counts, or scientific notation. */
static void label_linear(plot_axis *a, double step) {
    double maxabs = fmax(fabs(a->lo), fabs(a->hi));
    int dec = (int)fmax(0, -floor(log10(step) + 1e-9));
    for (int i = 0; i < a->nticks; i++) {
        char *s = a->label[i];
        double v = a->tick[i];
        if (v == 0) {
            snprintf(s, sizeof a->label[i], "0");
        } else if (maxabs >= 1e4 && step >= 100) {
            double div = maxabs >= 1e10 && step >= 1e8 ? 1e9 : maxabs >= 1e7 && step >= 1e5 ? 1e6 : 1e3;
            int d = (int)fmax(0, -floor(log10(step / div) + 1e-9));
            snprintf(s, sizeof a->label[i], "%.*f", d, v / div);
            strip_zeros(s);
            strcat(s, div == 1e9 ? "G" : div == 1e6 ? "M" : "k");
        } else if (dec <= 4 && maxabs < 1e6) {
            snprintf(s, sizeof a->label[i], "%.*f", dec, v);
        } else {
            int d = (int)fmax(0, fmin(6, floor(log10(maxabs)) - floor(log10(step) + 1e-9)));
            snprintf(s, sizeof a->label[i], "%.*e", d, v);
            tidy_exponent(s);
        }
    }
}

/* A flat range (one value) is widened so the line sits mid-axis. */
static void widen_flat(double *lo, double *hi, int is_step) {
    if (*hi - *lo > 1e-12 * fmax(fabs(*lo), fabs(*hi))) return;
    double v = *lo, d = v != 0 ? fabs(v) * 0.05 : 1;
    if (is_step) d = fmax(1, d);
    *lo = v - d;
    *hi = v + d;
    if (is_step && v >= 0 && *lo < 0) *lo = 0;
}

/* Linear axis. The y axis keeps 5% of air above and below the data (not
 * below 0 for data that never goes negative), so no point sits on the
 * frame; the step axis spans the data, from 0 when the first logged step is
 * near it. Ticks are the multiples of a 1-2-5 step inside. */
static void axis_linear(plot_axis *a, double lo, double hi, int target, int is_step) {
    widen_flat(&lo, &hi, is_step);
    if (is_step) {
        if (lo > 0 && lo < 0.1 * (hi - lo)) lo = 0;
    } else {
        double pad = 0.05 * (hi - lo);
        lo = lo >= 0 && lo - pad < 0 ? 0 : lo - pad;
        hi += pad;
    }
    double step = nice_step((hi - lo) / target);
    if (is_step && step < 1) step = 1; /* steps are whole numbers */
    if (is_step) { /* end on a labelled tick when that costs little room (995 -> 1000) */
        double up = ceil(hi / step - 1e-9) * step;
        if (up - hi <= 0.05 * (hi - lo)) hi = up;
    }
    a->log = 0;
    a->lo = lo;
    a->hi = hi;
    a->nticks = 0;
    for (double k = ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9 && a->nticks < MAX_TICKS; k++) {
        double v = k * step;
        a->tick[a->nticks++] = fabs(v) < step * 1e-9 ? 0 : v;
    }
    label_linear(a, step);
}

/* Log axis with the same 5% of air (in decades); ticks by span: powers of
 * ten (every stride-th), 1-2-5 of each decade, or, under a decade, 1..9. */
static void axis_log(plot_axis *a, double lo, double hi, int target) {
    double tlo = log10(lo), thi = log10(hi); /* both > 0: only positive values reach a log axis */
    if (thi - tlo < 1e-9) tlo -= 0.08, thi += 0.08;
    double pad = 0.05 * (thi - tlo);
    tlo -= pad;
    thi += pad;
    double dec = thi - tlo, l = pow(10, tlo), h = pow(10, thi);
    a->log = 1;
    a->lo = l;
    a->hi = h;
    a->nticks = 0;
    if (dec >= 3) {
        double stride = fmax(1, ceil(dec / target));
        for (double e = ceil(tlo); e <= thi && a->nticks < MAX_TICKS; e++)
            if (e - stride * floor(e / stride) == 0) a->tick[a->nticks++] = pow(10, e);
    } else if (dec >= 1) {
        static const double m[3] = {1, 2, 5};
        for (double e = floor(tlo); e <= ceil(thi); e++)
            for (int j = 0; j < 3 && a->nticks < MAX_TICKS; j++) {
                double v = m[j] * pow(10, e);
                if (v >= l && v <= h) a->tick[a->nticks++] = v;
            }
    } else {
        /* 1..9 of each decade, which spread evenly enough on a log axis;
         * a nice linear step when those are too few or too many */
        for (double e = floor(tlo); e <= ceil(thi); e++)
            for (int m = 1; m <= 9 && a->nticks < MAX_TICKS; m++) {
                double v = m * pow(10, e);
                if (v >= l && v <= h) a->tick[a->nticks++] = v;
            }
        if (a->nticks < 3 || a->nticks > target + 2) {
            double step = nice_step((h - l) / target);
            a->nticks = 0;
            for (double k = fmax(1, ceil(l / step - 1e-9)); k * step <= h * (1 + 1e-12) && a->nticks < MAX_TICKS; k++)
                a->tick[a->nticks++] = k * step;
        }
    }
    for (int i = 0; i < a->nticks; i++) {
        char *s = a->label[i];
        double v = a->tick[i];
        snprintf(s, sizeof a->label[i], v >= 1e-3 && v < 1e5 ? "%g" : "%.3g", v);
        tidy_exponent(s);
    }
}

/* ------------------------------------------------------------ chart */

static const char *const palette[10] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                        "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
#define NAME_MAX_CHARS 40
#define FONT "Helvetica, Arial, 'DejaVu Sans', 'Liberation Sans', sans-serif"
#define MAX_MARKERS 150 /* val series with more points are drawn as lines only */

typedef struct {
    int W, H;
    double x0, x1, y0, y1; /* plot area in pixels (y0 top) */
    plot_axis ax, ay;
    double lx, ly, lw, lh; /* legend box */
    int legend_rows;
} plot_layout;

typedef struct {
    plot_run *runs;
    int nruns;
    const plot_spec *spec;
    const whale_plot_opts *o;
    double xmin, xmax, ymin, ymax;
    int any_train, any_val; /* some run has points of a train-style / val-style key */
} plot_chart;

/* Number of legend rows and widest text (characters). */
static int legend_rows(const plot_chart *c, int *widest) {
    int rows = 0, w = 0;
    for (int r = 0; r < c->nruns; r++) {
        int n = text_chars(c->runs[r].name, NAME_MAX_CHARS);
        int empty = 1;
        for (int k = 0; k < c->spec->nkeys; k++) empty &= finite_count(&c->runs[r].s[k], c->o->log_y) == 0;
        if (empty) n += 10; /* " (no data)" */
        if (n > w) w = n;
        rows++;
    }
    if (c->any_train && c->any_val) {
        rows += 2;
        if (w < 10) w = 10;
    }
    *widest = w;
    return rows;
}

/* Whether segment a-b (or the point a, when b == a) touches the rectangle:
 * Liang-Barsky clipping. */
static int seg_hits(double ax, double ay, double bx, double by, double rx, double ry, double rw, double rh) {
    double t0 = 0, t1 = 1, dx = bx - ax, dy = by - ay;
    double p[4] = {-dx, dx, -dy, dy}, q[4] = {ax - rx, rx + rw - ax, ay - ry, ry + rh - ay};
    for (int i = 0; i < 4; i++) {
        if (p[i] == 0) {
            if (q[i] < 0) return 0;
        } else {
            double t = q[i] / p[i];
            if (p[i] < 0) t0 = fmax(t0, t);
            else t1 = fmin(t1, t);
        }
    }
    return t0 <= t1;
}

static int series_hits(const plot_series *s, const plot_layout *L, int log_y, double rx, double ry) {
    int hits = 0;
    double px = 0, py = 0;
    int have = 0;
    for (int i = 0; i < s->n; i++) {
        if (!drawable(s->p[i].y, log_y)) {
            have = 0;
            continue;
        }
        double x = axis_px(&L->ax, s->p[i].x), y = axis_px(&L->ay, s->p[i].y);
        if (!have) px = x, py = y;
        hits += seg_hits(px, py, x, y, rx - 4, ry - 4, L->lw + 8, L->lh + 8);
        px = x, py = y, have = 1;
    }
    return hits;
}

/* Axes and legend for a plot area whose right edge leaves right_margin. */
static void layout(const plot_chart *c, plot_layout *L, double right_margin) {
    const whale_plot_opts *o = c->o;
    L->W = o->width;
    L->H = o->height;
    int has_title = o->title && o->title[0];
    L->y0 = has_title ? 44 : 16;
    L->y1 = L->H - 50;
    if (L->y1 - L->y0 < 40) L->y1 = L->y0 + 40;
    int ytarget = (int)fmax(2, (L->y1 - L->y0) / 45);
    if (o->log_y) axis_log(&L->ay, c->ymin, c->ymax, ytarget);
    else axis_linear(&L->ay, c->ymin, c->ymax, ytarget, 0);
    int lab = 1;
    for (int i = 0; i < L->ay.nticks; i++) {
        int w = (int)strlen(L->ay.label[i]);
        if (w > lab) lab = w;
    }
    L->x0 = 44 + lab * 7.0;
    L->x1 = L->W - right_margin;
    if (L->x1 - L->x0 < 60) L->x1 = L->x0 + 60;
    L->ay.p0 = L->y1;
    L->ay.p1 = L->y0;
    int xtarget = (int)fmax(2, (L->x1 - L->x0) / 90);
    axis_linear(&L->ax, c->xmin, c->xmax, xtarget, 1);
    L->ax.p0 = L->x0;
    L->ax.p1 = L->x1;
    int widest;
    L->legend_rows = legend_rows(c, &widest);
    L->lw = 10 + 26 + 6 + widest * 7.0 + 10;
    L->lh = L->legend_rows * 18 + 12;
}

static void choose_legend(const plot_chart *c, plot_layout *L) {
    layout(c, L, 24);
    /* the corner the curves cross least; loss falls, so top right first */
    double cand[4][2] = {{L->x1 - 10 - L->lw, L->y0 + 10},
                         {L->x0 + 10, L->y0 + 10},
                         {L->x1 - 10 - L->lw, L->y1 - 10 - L->lh},
                         {L->x0 + 10, L->y1 - 10 - L->lh}};
    int best = -1, best_hits = 0;
    for (int k = 0; k < 4; k++) {
        if (cand[k][0] < L->x0 || cand[k][1] < L->y0) continue; /* legend larger than the plot */
        int hits = 0;
        for (int r = 0; r < c->nruns; r++)
            for (int s = 0; s < c->spec->nkeys; s++)
                hits += series_hits(&c->runs[r].s[s], L, c->o->log_y, cand[k][0], cand[k][1]);
        if (best < 0 || hits < best_hits) best = k, best_hits = hits;
    }
    if (best >= 0 && best_hits == 0) {
        L->lx = cand[best][0];
        L->ly = cand[best][1];
        return;
    }
    /* every corner would hide data: move the legend out to the right */
    double lw = L->lw;
    layout(c, L, lw + 34);
    L->lx = L->x1 + 18;
    L->ly = L->y0;
}

/* One path with a subpath per unbroken stretch, thinned per pixel column. */
static void emit_path(whale_sbuf *b, const plot_series *s, const plot_layout *L, int log_y, const char *attrs,
                      const char *name, const char *key) {
    size_t start = b->len;
    int segs = 0;
    whale_sb_printf(b, "<path d=\"");
    for (int i = 0; i < s->n;) {
        if (!drawable(s->p[i].y, log_y)) {
            i++;
            continue;
        }
        int j = i;
        while (j < s->n && drawable(s->p[j].y, log_y)) j++;
        if (j - i >= 2) {
            segs++;
            int first = 1;
            for (int a = i; a < j;) {
                double col = floor(axis_px(&L->ax, s->p[a].x));
                int e = a;
                int lo = a, hi = a;
                while (e < j && floor(axis_px(&L->ax, s->p[e].x)) == col) {
                    if (s->p[e].y < s->p[lo].y) lo = e;
                    if (s->p[e].y > s->p[hi].y) hi = e;
                    e++;
                }
                int pick[4] = {a, lo < hi ? lo : hi, lo < hi ? hi : lo, e - 1}, last = -1;
                for (int q = 0; q < 4; q++) {
                    if (pick[q] <= last) continue;
                    last = pick[q];
                    whale_sb_printf(b, "%c%.1f %.1f", first ? 'M' : 'L', axis_px(&L->ax, s->p[last].x),
                              axis_px(&L->ay, s->p[last].y));
                    first = 0;
                }
                a = e;
            }
        }
        i = j;
    }
    if (!segs) { /* only isolated points: the markers show them */
        whale_sb_truncate(b, start);
        return;
    }
    whale_sb_printf(b, "\" %s><title>", attrs);
    sb_text(b, name, NAME_MAX_CHARS);
    whale_sb_printf(b, " ");
    sb_text(b, key, 80);
    whale_sb_printf(b, "</title></path>\n");
}

/* Circles at the points: every point (val style), or only the isolated ones
 * that a line cannot show. */
static void emit_markers(whale_sbuf *b, const plot_series *s, const plot_layout *L, int log_y, int all, const char *color,
                         double r) {
    int open = 0;
    for (int i = 0; i < s->n; i++) {
        if (!drawable(s->p[i].y, log_y)) continue;
        int alone = (i == 0 || !drawable(s->p[i - 1].y, log_y)) && (i + 1 == s->n || !drawable(s->p[i + 1].y, log_y));
        if (!all && !alone) continue;
        if (!open) whale_sb_printf(b, "<g fill=\"%s\" stroke=\"#fff\" stroke-width=\"1\">", color);
        open = 1;
        whale_sb_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\"/>", axis_px(&L->ax, s->p[i].x),
                  axis_px(&L->ay, s->p[i].y), r);
    }
    if (open) whale_sb_printf(b, "</g>\n");
}

static void emit_svg(whale_sbuf *b, const plot_chart *c, const plot_layout *L) {
    const whale_plot_opts *o = c->o;
    int log_y = o->log_y;
    whale_sb_printf(b,
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
              "font-family=\"%s\" font-size=\"12\">\n",
              L->W, L->H, L->W, L->H, FONT);
    whale_sb_printf(b, "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", L->W, L->H);
    if (o->title && o->title[0]) {
        whale_sb_printf(b, "<text x=\"%.1f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\" "
                     "fill=\"#222\">",
                  (L->x0 + L->x1) / 2);
        sb_text(b, o->title, (int)((L->W - 40) / 9.5)); /* about one bold 16px character in 9.5px */
        whale_sb_printf(b, "</text>\n");
    }

    /* grid on whole pixels + 0.5 so 1px lines stay sharp */
    whale_sb_printf(b, "<g stroke=\"#e6e6e6\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n");
    for (int i = 0; i < L->ay.nticks; i++) {
        double y = floor(axis_px(&L->ay, L->ay.tick[i])) + 0.5;
        whale_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", L->x0, y, L->x1, y);
    }
    for (int i = 0; i < L->ax.nticks; i++) {
        double x = floor(axis_px(&L->ax, L->ax.tick[i])) + 0.5;
        whale_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, L->y0, x, L->y1);
    }
    whale_sb_printf(b, "</g>\n<g stroke=\"#888\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n");
    double bx = floor(L->x0) + 0.5, by = floor(L->y1) + 0.5;
    whale_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", bx, L->y0, bx, by);
    whale_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", bx, by, L->x1, by);
    for (int i = 0; i < L->ay.nticks; i++) {
        double y = floor(axis_px(&L->ay, L->ay.tick[i])) + 0.5;
        whale_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", bx - 4, y, bx, y);
    }
    for (int i = 0; i < L->ax.nticks; i++) {
        double x = floor(axis_px(&L->ax, L->ax.tick[i])) + 0.5;
        whale_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, by, x, by + 4);
    }
    whale_sb_printf(b, "</g>\n<g fill=\"#555\">\n");
    for (int i = 0; i < L->ay.nticks; i++)
        whale_sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L->x0 - 8,
                  axis_px(&L->ay, L->ay.tick[i]) + 4, L->ay.label[i]);
    for (int i = 0; i < L->ax.nticks; i++)
        whale_sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", axis_px(&L->ax, L->ax.tick[i]),
                  L->y1 + 19, L->ax.label[i]);
    whale_sb_printf(b, "</g>\n<g fill=\"#333\" font-size=\"13\">\n");
    whale_sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", (L->x0 + L->x1) / 2, L->y1 + 40);
    whale_sb_printf(b, "<text transform=\"translate(18 %.1f) rotate(-90)\" text-anchor=\"middle\">",
              (L->y0 + L->y1) / 2);
    sb_text(b, c->spec->ylabel, 60);
    whale_sb_printf(b, "%s</text>\n</g>\n", log_y ? " (log scale)" : "");

    /* faint raw lines under their averages, val curves and markers on top */
    const char *lc = "fill=\"none\" stroke-linejoin=\"round\" stroke-linecap=\"round\"";
    char attrs[256];
    for (int pass = 0; pass < 3; pass++)
        for (int r = 0; r < c->nruns; r++) {
            const plot_run *run = &c->runs[r];
            const char *color = palette[r % 10];
            for (int k = 0; k < c->spec->nkeys; k++) {
                const plot_series *s = &run->s[k];
                int val = c->spec->val_style[k];
                if (pass == 0 && !val) {
                    int sm = k == 0 && run->smooth.n > 0;
                    snprintf(attrs, sizeof attrs, "%s stroke=\"%s\" stroke-width=\"%s\"%s", lc, color,
                             sm ? "1" : "1.6", sm ? " stroke-opacity=\"0.3\"" : "");
                    emit_path(b, s, L, log_y, attrs, run->name, c->spec->key[k]);
                    emit_markers(b, s, L, log_y, 0, color, 3);
                } else if (pass == 1 && !val && k == 0 && run->smooth.n > 0) {
                    snprintf(attrs, sizeof attrs, "%s stroke=\"%s\" stroke-width=\"2\"", lc, color);
                    char key[96];
                    snprintf(key, sizeof key, "%s (moving average)", c->spec->key[k]);
                    emit_path(b, &run->smooth, L, log_y, attrs, run->name, key);
                } else if (pass == 2 && val) {
                    snprintf(attrs, sizeof attrs, "%s stroke=\"%s\" stroke-width=\"1.6\"%s", lc, color,
                             c->any_train ? " stroke-dasharray=\"6 3\"" : "");
                    emit_path(b, s, L, log_y, attrs, run->name, c->spec->key[k]);
                    emit_markers(b, s, L, log_y, finite_count(s, log_y) <= MAX_MARKERS, color, 3.2);
                }
            }
        }

    /* legend: a color per run, then how train and val lines look */
    whale_sb_printf(b,
              "<g font-size=\"12\">\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"4\" "
              "fill=\"#ffffff\" fill-opacity=\"0.9\" stroke=\"#cccccc\"/>\n",
              L->lx, L->ly, L->lw, L->lh);
    double row = L->ly + 6 + 9;
    for (int r = 0; r < c->nruns; r++, row += 18) {
        const plot_run *run = &c->runs[r];
        int empty = 1;
        for (int k = 0; k < c->spec->nkeys; k++) empty &= finite_count(&run->s[k], log_y) == 0;
        whale_sb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\" "
                  "stroke-linecap=\"round\"/>\n",
                  L->lx + 12, row, L->lx + 34, row, palette[r % 10]);
        whale_sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#222\">", L->lx + 42, row + 4);
        sb_text(b, run->name, NAME_MAX_CHARS);
        whale_sb_printf(b, "%s</text>\n", empty ? " (no data)" : "");
    }
    if (c->any_train && c->any_val) {
        whale_sb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#777\" stroke-width=\"2\"/>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">train</text>\n",
                  L->lx + 12, row, L->lx + 34, row, L->lx + 42, row + 4);
        row += 18;
        whale_sb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#777\" stroke-width=\"1.6\" "
                  "stroke-dasharray=\"6 3\"/>\n<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.2\" fill=\"#777\" "
                  "stroke=\"#fff\"/>\n<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">val</text>\n",
                  L->lx + 12, row, L->lx + 34, row, L->lx + 23, row, L->lx + 42, row + 4);
    }
    whale_sb_printf(b, "</g>\n</svg>\n");
}

/* ------------------------------------------------------------ entry points */

static void runs_free(plot_run *runs, int n) {
    if (!runs) return;
    for (int r = 0; r < n; r++) {
        free(runs[r].name);
        for (int k = 0; k < 2; k++) free(runs[r].s[k].p);
        free(runs[r].smooth.p);
    }
    free(runs);
}

/* Two inputs with the same name (run1 in two folders) get " (2)", " (3)". */
static whale_code unique_names(plot_run *runs, int n) {
    for (int r = 1; r < n; r++) {
        int dup = 1;
        for (int q = 0; q < r; q++) dup += !strcmp(runs[q].name, runs[r].name);
        if (dup == 1) continue;
        size_t len = strlen(runs[r].name) + 16;
        char *name = malloc(len);
        if (!name) return WHALE_ERR_NOMEM;
        snprintf(name, len, "%s (%d)", runs[r].name, dup);
        free(runs[r].name);
        runs[r].name = name;
    }
    return WHALE_OK;
}

whale_code whale_plot_render(const char *const *inputs, int n, const whale_plot_opts *opts, char **svg,
                             size_t *len, whale_err *err) {
    *svg = NULL;
    if (len) *len = 0;
    whale_plot_opts o = {0};
    if (opts) o = *opts;
    if (n < 1 || !inputs) return whale_errf(err, WHALE_ERR_ARG, "plot: no inputs given");
    if (o.width == 0) o.width = 900;
    if (o.height == 0) o.height = 540;
    if (o.width < 200 || o.width > 20000 || o.height < 150 || o.height > 20000)
        return whale_errf(err, WHALE_ERR_ARG, "plot: size %dx%d outside 200x150 .. 20000x20000", o.width, o.height);
    if (o.smooth < 0) return whale_errf(err, WHALE_ERR_ARG, "plot: smoothing window %d is negative", o.smooth);

    plot_spec spec = {{NULL, NULL}, {0, 0}, 1, NULL};
    if (!o.metric || !o.metric[0] || !strcmp(o.metric, "loss")) {
        spec = (plot_spec){{"loss", "val_loss"}, {0, 1}, 2, "loss"};
    } else {
        if (!strcmp(o.metric, "step")) return whale_errf(err, WHALE_ERR_ARG, "plot: \"step\" is the x axis");
        spec = (plot_spec){{o.metric, NULL}, {!strncmp(o.metric, "val_", 4), 0}, 1, o.metric};
    }

    plot_run *runs = calloc((size_t)n, sizeof(plot_run));
    if (!runs) return whale_errf(err, WHALE_ERR_NOMEM, "plot: out of memory");
    whale_code rc = WHALE_OK;
    for (int r = 0; r < n && !rc; r++) rc = read_run(inputs[r], &spec, &runs[r], err);
    if (!rc && unique_names(runs, n)) rc = whale_errf(err, WHALE_ERR_NOMEM, "plot: out of memory");

    plot_chart c = {runs, n, &spec, &o, INFINITY, -INFINITY, INFINITY, -INFINITY, 0, 0};
    for (int r = 0; r < n && !rc; r++) {
        plot_run *run = &runs[r];
        for (int k = 0; k < spec.nkeys; k++) {
            plot_series *s = &run->s[k];
            series_sort(s);
            for (int i = 0; i < s->n; i++) {
                c.xmin = fmin(c.xmin, s->p[i].x);
                c.xmax = fmax(c.xmax, s->p[i].x);
                if (!drawable(s->p[i].y, o.log_y)) continue;
                c.ymin = fmin(c.ymin, s->p[i].y);
                c.ymax = fmax(c.ymax, s->p[i].y);
            }
            if (finite_count(s, o.log_y) == 0) continue;
            if (spec.val_style[k]) c.any_val = 1;
            else c.any_train = 1;
        }
        /* the automatic average is for noisy train loss, not for lr and the like */
        int fin = finite_count(&run->s[0], o.log_y), window = 1;
        if (o.smooth >= 2) window = o.smooth;
        else if (o.smooth == 0 && !strcmp(spec.key[0], "loss") && fin >= 20) window = (int)fmax(3, lround(fin * 0.02));
        if (!spec.val_style[0] && window >= 2 && fin >= 3 && series_smooth(&run->s[0], window, o.log_y, &run->smooth))
            rc = whale_errf(err, WHALE_ERR_NOMEM, "plot: out of memory");
    }
    if (!rc && !(c.ymin <= c.ymax)) {
        char what[200];
        snprintf(what, sizeof what, "no %s \"%s\"%s%s%s values", o.log_y ? "positive" : "finite", spec.key[0],
                 spec.nkeys == 2 ? " or \"" : "", spec.nkeys == 2 ? spec.key[1] : "", spec.nkeys == 2 ? "\"" : "");
        if (n == 1) rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: %s to plot", inputs[0], what);
        else rc = whale_errf(err, WHALE_ERR_FORMAT, "plot: %s in any of the %d inputs", what, n);
    }
    if (!rc && !isfinite(c.ymax - c.ymin))
        rc = whale_errf(err, WHALE_ERR_RANGE, "plot: values from %g to %g are too far apart to plot", c.ymin, c.ymax);
    if (rc) {
        runs_free(runs, n);
        return rc;
    }

    plot_layout L;
    choose_legend(&c, &L);
    whale_sbuf b = {0};
    emit_svg(&b, &c, &L);
    runs_free(runs, n);
    if (b.oom) {
        free(b.p);
        return whale_errf(err, WHALE_ERR_NOMEM, "plot: out of memory");
    }
    *svg = b.p;
    if (len) *len = b.len;
    return WHALE_OK;
}

whale_code whale_plot_svg(const char *const *inputs, int n, const whale_plot_opts *opts, const char *out_path,
                          whale_err *err) {
    char *svg;
    size_t len;
    whale_code rc = whale_plot_render(inputs, n, opts, &svg, &len, err);
    if (rc) return rc;
    rc = whale_write_file_atomic(out_path, svg, len, err);
    free(svg);
    return rc;
}
