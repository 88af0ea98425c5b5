/* Dynamic loss scaling for fp16 training, with the semantics of PyTorch's
 * torch.cuda.amp.GradScaler: the loss is multiplied by `scale` before the
 * backward pass so small gradients survive fp16; a step whose gradients
 * contain inf/NaN is skipped and the scale halved; after growth_interval
 * clean steps in a row the scale doubles. */
#include "whale.h"

void whale_loss_scaler_init(whale_loss_scaler *s) {
    s->scale = 65536.0;
    s->growth_factor = 2.0;
    s->backoff_factor = 0.5;
    s->growth_interval = 2000;
    s->clean_steps = 0;
    s->skipped = 0;
}

int whale_loss_scaler_update(whale_loss_scaler *s, int found_nonfinite) {
    if (found_nonfinite) {
        s->scale *= s->backoff_factor;
        s->clean_steps = 0;
        s->skipped++;
        return 0;
    }
    if (++s->clean_steps == s->growth_interval) {
        s->scale *= s->growth_factor;
        s->clean_steps = 0;
    }
    return 1;
}
