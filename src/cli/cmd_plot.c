/* whale plot: training curves of one or more runs as an SVG chart */
#include "cli/cli.h"

#include "train/plot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char plot_help[] =
    "usage: whale plot RUN_OR_JSONL... --out FILE.svg [--title T] [--metric KEY] [--log-y]\n"
    "                  [--smooth N] [--width W] [--height H]\n"
    "  draws training curves from each run folder's metrics.jsonl (or a .jsonl file),\n"
    "  runs overlaid, one color each, named after the folder or the file stem.\n"
    "  --metric KEY  what to draw (default loss: train loss as a thin line with a\n"
    "                moving average, val_loss as markers); lr, grad_norm, val_ppl,\n"
    "                tokens_per_s, ... any numeric key of the lines, against step\n"
    "  --log-y       logarithmic y axis (values <= 0 are left out)\n"
    "  --smooth N    moving-average window over train-style lines (1 = none;\n"
    "                default about 2% of the points, for train loss only)\n"
    "  --width/--height  canvas size in pixels (default 900 x 540)\n"
    "  NaN and infinite values leave a gap in the line.";

int cmd_plot(int argc, char **argv) {
    whale_plot_opts opts = {0};
    const char *out = NULL;
    const char **inputs = malloc(sizeof(char *) * (size_t)(argc > 0 ? argc : 1));
    if (!inputs) {
        whale_err err;
        whale_errf(&err, WHALE_ERR_NOMEM, "plot: out of memory");
        return cli_fail(&err);
    }
    int n = 0, status = 0;
    for (int i = 1; i < argc && !status; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts(plot_help);
            free(inputs);
            return 0;
        }
        if (!strcmp(a, "--out") || !strcmp(a, "-o") || !strcmp(a, "--title") || !strcmp(a, "--metric") ||
            !strcmp(a, "--smooth") || !strcmp(a, "--width") || !strcmp(a, "--height")) {
            const char *v = cli_value(argc, argv, &i);
            long num = 0;
            if (!v) status = cli_usage("plot", "%s needs a value", a);
            else if (!strcmp(a, "--out") || !strcmp(a, "-o")) out = v;
            else if (!strcmp(a, "--title")) opts.title = v;
            else if (!strcmp(a, "--metric")) opts.metric = v;
            else if (!strcmp(a, "--smooth")) {
                if (!(status = cli_int("plot", a, v, 1, 1000000, &num))) opts.smooth = (int)num;
            } else if (!(status = cli_int("plot", a, v, !strcmp(a, "--width") ? 200 : 150, 20000, &num))) {
                if (!strcmp(a, "--width")) opts.width = (int)num;
                else opts.height = (int)num;
            }
        } else if (!strcmp(a, "--log-y")) {
            opts.log_y = 1;
        } else if (a[0] == '-' && a[1]) {
            status = cli_usage("plot", "unknown option \"%s\"", a);
        } else {
            inputs[n++] = a;
        }
    }
    if (!status && n == 0) status = cli_usage("plot", "give at least one run folder or .jsonl file");
    if (!status && !out) status = cli_usage("plot", "--out FILE.svg is required");
    if (!status && opts.metric && !opts.metric[0]) status = cli_usage("plot", "--metric needs a key name");
    if (status) {
        free(inputs);
        return status;
    }
    whale_err err;
    if (whale_plot_svg(inputs, n, &opts, out, &err)) {
        free(inputs);
        return cli_fail(&err);
    }
    free(inputs);
    return 0;
}
