/**
 * What the kernel tells the page (tpunb/labcomm.py, message type "state"), and the words
 * the status bar and the picker make of it. Pure functions, so the wording is unit-tested
 * without a kernel.
 */

/** The modes in the order users meet them (the kernel sends the ones its runtime runs). */
export const MODES = ['debug', 'strict', 'fused', 'compile'];

/** Device memory as the kernel's runtime reports it; unknown figures are null, never 0. */
export interface IMemory {
  label: string;
  used: number | null;
  peak: number | null;
  limit: number | null;
}

/** The kernel's tpunb state. */
export interface IKernelState {
  type: 'state';
  version: string;
  runtime: string;
  device: string;
  /** The mode ops run in right now (a `%%tpu_mode` cell shows here while it runs). */
  mode: string;
  /** The mode of the next cells. */
  default: string;
  modes: string[];
  /** A cell is running. */
  busy: boolean;
  /** A mode picked while a cell ran: the kernel applies it when that cell ends. */
  pending: string | null;
  memory: IMemory | null;
  /** The precision ops run in right now (`%tpu_precision`); absent from older kernels. */
  precision?: string;
  /** The precision of the next cells. */
  default_precision?: string;
  /** The precisions this runtime accepts. */
  precisions?: string[];
  /** A precision picked while a cell ran: applied when that cell ends. */
  pending_precision?: string | null;
  /** The kernel serves the page's requests on its control channel (tpunb/lab_control.py). */
  control?: boolean;
}

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** The unit that shows `reference` bytes as at least 1 (GiB for 16 GiB, MiB for 300 MiB). */
function unitFor(reference: number): number {
  let power = 0;
  while (power < UNITS.length - 1 && reference >= 1024 ** (power + 1)) {
    power += 1;
  }
  return power;
}

/** One decimal below 100, as the monitor panel shows it (`23.5 GiB`, not `24`), without a
 * trailing `.0` (`16 GiB`). */
function inUnit(count: number, power: number): string {
  const value = count / 1024 ** power;
  if (power === 0 || value >= 100) {
    return value.toFixed(0);
  }
  return value.toFixed(1).replace(/\.0$/, '');
}

/**
 * `HBM 3.1 / 16 GiB`, or `host RSS 246 MiB / 23.5 GiB` when used and limit need different
 * units; what the runtime cannot measure reads n/a.
 */
export function formatMemory(memory: IMemory | null): string {
  if (memory === null || memory.used === null) {
    return 'memory n/a';
  }
  const usedPower = unitFor(memory.used);
  if (memory.limit === null) {
    return `${memory.label} ${inUnit(memory.used, usedPower)} ${UNITS[usedPower]} / n/a`;
  }
  const limitPower = unitFor(memory.limit);
  const used =
    usedPower === limitPower
      ? inUnit(memory.used, usedPower)
      : `${inUnit(memory.used, usedPower)} ${UNITS[usedPower]}`;
  return `${memory.label} ${used} / ${inUnit(memory.limit, limitPower)} ${UNITS[limitPower]}`;
}

/** The status bar item: `tpunb · fused · HBM 3.1 / 16 GiB`, `tpunb · fused · bf16 · ...`. */
export function statusText(state: IKernelState): string {
  const precision =
    state.precision && state.precision !== 'fp32'
      ? ` · ${state.precision}`
      : '';
  return `tpunb · ${state.mode}${precision} · ${formatMemory(state.memory)}`;
}

/** The precision the picker shows: a pick waiting for the running cell, else the default. */
export function pickedPrecision(state: IKernelState): string {
  return state.pending_precision ?? state.default_precision ?? 'fp32';
}

/** The status item's tooltip: where the kernel runs and what clicking does. */
export function statusTitle(state: IKernelState): string {
  const peak =
    state.memory && state.memory.peak !== null
      ? `, peak ${formatMemory({ ...state.memory, used: state.memory.peak })}`
      : '';
  return (
    `tpunb ${state.version}: ${state.runtime} runtime on ${state.device}; ` +
    `next cells run in ${state.default} mode${peak}. Click for the live monitor.`
  );
}

/**
 * The mode the picker shows: the one the user picked if the kernel has not applied it yet
 * (it waits for the running cell), else the kernel's default.
 */
export function pickedMode(
  state: IKernelState,
  requested: string | null
): string {
  return state.pending ?? requested ?? state.default;
}

/** The picker's note while a picked mode waits for the running cell; null when none waits. */
export function pendingNote(
  state: IKernelState,
  requested: string | null
): string | null {
  const waiting = state.pending ?? requested;
  if (waiting === null || waiting === state.default) {
    return null;
  }
  return state.busy || state.pending !== null
    ? `${waiting} from the next cell (this one keeps running in ${state.mode})`
    : `switching to ${waiting}…`;
}

/** Parse a comm message's data into a state, or null if it is not one. */
export function asKernelState(data: unknown): IKernelState | null {
  const candidate = data as Partial<IKernelState> | null;
  if (
    candidate &&
    candidate.type === 'state' &&
    typeof candidate.mode === 'string' &&
    typeof candidate.default === 'string'
  ) {
    return candidate as IKernelState;
  }
  return null;
}
