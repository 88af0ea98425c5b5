/* whale tokenize / detokenize */
#include "cli.h"

#include "whale_util.h"
#include "whale_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Print token bytes readably: printable text as is, the usual escapes for
 * control characters, \xNN for the rest and for bytes that are not whole
 * UTF-8 (a token may hold part of a character). */
static void print_piece(const unsigned char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        int len = 0;
        if (c >= 0x80) { /* a whole, valid character is printed as is */
            int more = c >= 0xF0 && c <= 0xF4 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c <= 0xDF ? 1 : -1;
            if (more > 0 && n - i > (size_t)more) {
                len = more + 1;
                for (int k = 1; k <= more; k++)
                    if ((s[i + k] & 0xC0) != 0x80) len = 0;
                /* no overlong forms, surrogates or values above U+10FFFF */
                if (len && ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) ||
                            (c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F)))
                    len = 0;
            }
        }
        if (len) {
            fwrite(s + i, 1, (size_t)len, stdout);
            i += (size_t)len;
            continue;
        }
        switch (c) {
        case '\n': fputs("\\n", stdout); break;
        case '\r': fputs("\\r", stdout); break;
        case '\t': fputs("\\t", stdout); break;
        case '"': fputs("\\\"", stdout); break;
        case '\\': fputs("\\\\", stdout); break;
        default:
            if (c < 0x20 || c >= 0x7F) printf("\\x%02X", c);
            else putchar((int)c);
        }
        i++;
    }
    putchar('"');
}

static const char tokenize_help[] =
    "usage: whale tokenize -m DIR (TEXT | --file FILE) [--show] [--add-special]\n"
    "  prints the token ids, comma-separated; --show prints one token per line:\n"
    "  its id and its text (escapes for control characters and partial UTF-8).\n"
    "  DIR holds tokenizer.json (and tokenizer_config.json); --add-special adds\n"
    "  the BOS/EOS the tokenizer is configured to add.";

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *text = NULL;
    int show = 0, add_special = 0;
    cli_args args = {0};
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &dir, 0, 0, NULL},
        {"--file", CLI_STR, &file, 0, 0, NULL},
        {"--show", CLI_SWITCH, &show, 0, 0, NULL},
        {"--add-special", CLI_SWITCH, &add_special, 0, 0, NULL},
        {"TEXT", CLI_ARGS, &args, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int parsed = cli_parse("tokenize", tokenize_help, argc, argv, table, NULL, NULL);
    if (args.n == 1) text = args.v[0];
    free(args.v);
    if (parsed) return parsed < 0 ? 0 : parsed;
    if (args.n > 1) return cli_usage("tokenize", "give the text as one argument (quote it)");
    if (!dir) return cli_usage("tokenize", "-m DIR is required");
    if (!text == !file) return cli_usage("tokenize", "give either TEXT or --file FILE");
    whale_err err;
    char *buf = NULL;
    size_t len;
    if (file) {
        if (whale_read_file(file, &buf, &len, &err)) return cli_fail(&err);
        text = buf;
    } else {
        len = strlen(text);
    }
    whale_tokenizer *t;
    if (whale_tokenizer_load(dir, &t, &err)) {
        free(buf);
        return cli_fail(&err);
    }
    int32_t *ids;
    int n;
    whale_code rc = whale_tokenizer_encode(t, text, len, add_special, &ids, &n, &err);
    free(buf);
    if (rc) {
        whale_tokenizer_free(t);
        return cli_fail(&err);
    }
    for (int i = 0; i < n; i++) {
        if (show) {
            size_t bl;
            const char *b = whale_tokenizer_token_bytes(t, ids[i], &bl);
            printf("%d\t", (int)ids[i]);
            print_piece((const unsigned char *)b, bl);
            putchar('\n');
        } else {
            printf(i ? ",%d" : "%d", (int)ids[i]);
        }
    }
    if (!show) putchar('\n');
    free(ids);
    whale_tokenizer_free(t);
    return 0;
}

static const char detokenize_help[] =
    "usage: whale detokenize -m DIR --ids 1,2,3 [--skip-special]\n"
    "  prints the decoded text exactly (no newline is added); --skip-special\n"
    "  leaves out the tokens marked special (BOS, EOS, ...)";

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *list = NULL;
    int skip = 0;
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &dir, 0, 0, NULL},
        {"--ids", CLI_STR, &list, 0, 0, NULL},
        {"--skip-special", CLI_SWITCH, &skip, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int parsed = cli_parse("detokenize", detokenize_help, argc, argv, table, NULL, NULL);
    if (parsed) return parsed < 0 ? 0 : parsed;
    if (!dir || !list) return cli_usage("detokenize", "-m DIR and --ids are required");
    int32_t *ids;
    int n, status = cli_parse_id_list("detokenize", list, &ids, &n);
    if (status) return status;
    whale_err err;
    whale_tokenizer *t;
    if (whale_tokenizer_load(dir, &t, &err)) {
        free(ids);
        return cli_fail(&err);
    }
    char *text;
    size_t len;
    whale_code rc = whale_tokenizer_decode(t, ids, n, skip, &text, &len, &err);
    free(ids);
    whale_tokenizer_free(t);
    if (rc) return cli_fail(&err);
    fwrite(text, 1, len, stdout);
    free(text);
    return 0;
}
