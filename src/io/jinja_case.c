/* Case mapping for the Jinja renderer's upper / lower / capitalize, as
 * JavaScript's toUpperCase / toLowerCase map: ASCII, Latin-1, Latin
 * Extended-A, Greek and Cyrillic (with ß → SS and Greek final sigma).
 * Characters outside these blocks are left as they are. */
#include "io/jinja_impl.h"

/* Latin Extended-A pairs: in [lo, hi] the upper case letter of a pair has
 * the parity par (0 even, 1 odd). */
static const struct {
    unsigned lo, hi, par;
} pairs[] = {{0x100, 0x12F, 0}, {0x132, 0x137, 0}, {0x139, 0x148, 1}, {0x14A, 0x177, 0}, {0x179, 0x17E, 1},
             {0x460, 0x481, 0}, {0x48A, 0x4BF, 0}};

static int paired(unsigned u, int to_upper, unsigned *out) {
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        if (u < pairs[k].lo || u > pairs[k].hi) continue;
        int is_upper = (u & 1u) == pairs[k].par;
        *out = is_upper == to_upper ? u : to_upper ? u - 1 : u + 1;
        return 1;
    }
    return 0;
}

unsigned jcase_upper(unsigned u) {
    unsigned m;
    if (u >= 'a' && u <= 'z') return u - 32;
    if (u < 0x80) return u;
    if ((u >= 0xE0 && u <= 0xFE && u != 0xF7)) return u - 0x20;
    if (u == 0xFF) return 0x178;
    if (u == 0xB5) return 0x39C;
    if (u == 0x131) return 'I';
    if (u == 0x17F) return 'S';
    if (paired(u, 1, &m)) return m;
    if (u >= 0x3B1 && u <= 0x3C9) return u == 0x3C2 ? 0x3A3 : u - 0x20;
    if (u == 0x3AC) return 0x386;
    if (u >= 0x3AD && u <= 0x3AF) return u - 0x25;
    if (u == 0x3CC) return 0x38C;
    if (u == 0x3CD || u == 0x3CE) return u - 0x3F;
    if (u >= 0x430 && u <= 0x44F) return u - 0x20;
    if (u >= 0x450 && u <= 0x45F) return u - 0x50;
    return u;
}

unsigned jcase_lower(unsigned u) {
    unsigned m;
    if (u >= 'A' && u <= 'Z') return u + 32;
    if (u < 0x80) return u;
    if (u >= 0xC0 && u <= 0xDE && u != 0xD7) return u + 0x20;
    if (u == 0x178) return 0xFF;
    if (u != 0x130 && paired(u, 0, &m)) return m;
    if (u >= 0x391 && u <= 0x3A9 && u != 0x3A2) return u + 0x20;
    if (u == 0x386) return 0x3AC;
    if (u >= 0x388 && u <= 0x38A) return u + 0x25;
    if (u == 0x38C) return 0x3CC;
    if (u == 0x38E || u == 0x38F) return u + 0x3F;
    if (u >= 0x410 && u <= 0x42F) return u + 0x20;
    if (u >= 0x400 && u <= 0x40F) return u + 0x50;
    return u;
}

/* a letter these tables know (for Greek final sigma) */
int jcase_cased(unsigned u) { return jcase_upper(u) != u || jcase_lower(u) != u || u == 0xDF; }
