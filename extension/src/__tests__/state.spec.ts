import {
  asKernelState,
  formatMemory,
  IKernelState,
  pendingNote,
  pickedMode,
  pickedPrecision,
  statusText,
  statusTitle
} from '../state';

const GiB = 1024 ** 3;

function state(overrides: Partial<IKernelState> = {}): IKernelState {
  return {
    type: 'state',
    version: '0.1.0',
    runtime: 'torchtpu',
    device: 'tpu:0',
    mode: 'fused',
    default: 'fused',
    modes: ['debug', 'strict', 'fused', 'compile'],
    busy: false,
    pending: null,
    memory: { label: 'HBM', used: 3.1 * GiB, peak: 5.5 * GiB, limit: 16 * GiB },
    ...overrides
  };
}

describe('formatMemory', () => {
  it('shows used and limit in one unit when they share it', () => {
    expect(formatMemory(state().memory)).toBe('HBM 3.1 / 16 GiB');
    expect(
      formatMemory({
        label: 'host RSS',
        used: 300 * 1024 ** 2,
        peak: null,
        limit: 512 * 1024 ** 2
      })
    ).toBe('host RSS 300 / 512 MiB');
    expect(
      formatMemory({
        label: 'CUDA memory',
        used: 2.5 * GiB,
        peak: 0,
        limit: 139.8 * GiB
      })
    ).toBe('CUDA memory 2.5 / 140 GiB');
  });

  it('gives used its own unit when it is much smaller than the limit', () => {
    const rss = {
      label: 'host RSS',
      used: 245.7 * 1024 ** 2,
      peak: null,
      limit: 23.5 * GiB
    };
    expect(formatMemory(rss)).toBe('host RSS 246 MiB / 23.5 GiB'); // as the panel says
    const idle = { label: 'CUDA memory', used: 0, peak: 0, limit: 80 * GiB };
    expect(formatMemory(idle)).toBe('CUDA memory 0 B / 80 GiB');
  });

  it('says n/a for what the runtime cannot measure, never 0', () => {
    expect(formatMemory(null)).toBe('memory n/a');
    expect(
      formatMemory({ label: 'HBM', used: null, peak: null, limit: 16 * GiB })
    ).toBe('memory n/a');
    expect(
      formatMemory({ label: 'HBM', used: 2 * GiB, peak: null, limit: null })
    ).toBe('HBM 2 GiB / n/a');
  });
});

describe('status item', () => {
  it('reads like the issue asks: tool, mode in effect, memory', () => {
    expect(statusText(state())).toBe('tpunb · fused · HBM 3.1 / 16 GiB');
    expect(statusText(state({ mode: 'debug', default: 'fused' }))).toBe(
      'tpunb · debug · HBM 3.1 / 16 GiB'
    );
  });

  it('names the precision when it is not fp32', () => {
    expect(statusText(state({ precision: 'bf16' }))).toBe(
      'tpunb · fused · bf16 · HBM 3.1 / 16 GiB'
    );
    expect(statusText(state({ precision: 'fp32' }))).toBe(
      'tpunb · fused · HBM 3.1 / 16 GiB'
    );
  });

  it('names the runtime, the next mode and the peak in its tooltip', () => {
    expect(statusTitle(state({ mode: 'debug' }))).toBe(
      'tpunb 0.1.0: torchtpu runtime on tpu:0; next cells run in fused mode, peak HBM 5.5 / 16 GiB. ' +
        'Click for the live monitor.'
    );
  });
});

describe('picker', () => {
  it('shows the kernel default when nothing waits', () => {
    expect(pickedMode(state(), null)).toBe('fused');
    expect(pendingNote(state(), null)).toBeNull();
    expect(pendingNote(state(), 'fused')).toBeNull(); // picked what is already in effect
  });

  it('says a pick made during a running cell waits for it', () => {
    const busy = state({ busy: true, mode: 'fused' });
    expect(pickedMode(busy, 'debug')).toBe('debug');
    expect(pendingNote(busy, 'debug')).toBe(
      'debug from the next cell (this one keeps running in fused)'
    );
    // the kernel confirmed it is pending (the request reached it during the cell)
    const pending = state({ busy: true, pending: 'strict' });
    expect(pickedMode(pending, null)).toBe('strict');
    expect(pendingNote(pending, null)).toBe(
      'strict from the next cell (this one keeps running in fused)'
    );
  });

  it('shows a pick in flight between cells as switching', () => {
    expect(pendingNote(state(), 'compile')).toBe('switching to compile…');
  });
});

describe('asKernelState', () => {
  it('accepts state messages only', () => {
    expect(asKernelState(state())).not.toBeNull();
    expect(asKernelState({ type: 'monitor', state: {} })).toBeNull();
    expect(asKernelState(null)).toBeNull();
    expect(asKernelState({ type: 'state' })).toBeNull();
  });
});

describe('pickedPrecision', () => {
  it('shows a pick that waits for the running cell, else the default', () => {
    expect(pickedPrecision(state())).toBe('fp32'); // a kernel from before precisions
    expect(pickedPrecision(state({ default_precision: 'bf16' }))).toBe('bf16');
    expect(
      pickedPrecision(
        state({ default_precision: 'fp32', pending_precision: 'bf16' })
      )
    ).toBe('bf16');
  });
});
