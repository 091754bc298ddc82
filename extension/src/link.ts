import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { asKernelState, IKernelState } from './state';

/** The comm target tpunb's kernel side opens and accepts (tpunb/labcomm.py). */
export const TARGET = 'tpunb';

/**
 * Requests the kernel serves on its control channel (tpunb/lab_control.py) when its state says
 * `control`: there they arrive while cells run, where the shell channel queues them behind
 * every cell of a Run All. A pick goes there only while cells run or wait: the kernel applies
 * a pick made there when a cell ends or begins, and one sent on the shell channel between
 * cells at once. Busy is asked of the notebook's cells first: JupyterLab's kernel status can
 * read idle under a running cell (its own subshell requests on the control channel).
 */
const ON_CONTROL = new Set(['hello', 'monitor']);
const ON_CONTROL_WHILE_BUSY = new Set(['set_mode', 'set_precision']);

/** A message from the kernel other than state: monitor ticks, its view code, graphs, errors. */
export interface IKernelMessage {
  type: string;
  [key: string]: unknown;
}

/**
 * One notebook's line to tpunb in its kernel.
 *
 * The comm target is registered on every kernel the notebook connects to, before any cell
 * runs, so `%load_ext tpunb` finds the page listening. A page that arrives later (a reload)
 * asks the kernel which tpunb comms exist and, if tpunb is loaded, opens its own. A restart,
 * a dead kernel or a kernel change drops the state: the page shows nothing until the new
 * kernel loads tpunb.
 */
export class KernelLink implements IDisposable {
  /** `cellsRunning`: whether the notebook has cells running or queued. */
  constructor(
    session: ISessionContext,
    private readonly _cellsRunning: () => boolean = () => false
  ) {
    session.kernelChanged.connect(this._onKernelChanged, this);
    session.statusChanged.connect(this._onStatus, this);
    session.connectionStatusChanged.connect(this._onConnection, this);
    this._attach(session.session?.kernel ?? null);
  }

  /** The kernel's tpunb state; null when the kernel has not loaded tpunb. */
  get state(): IKernelState | null {
    return this._state;
  }

  /**
   * The comm requests go on (null: none). It can change while tpunb stays loaded: a page
   * that asked for open comms as the kernel opened its own uses the kernel's, and closes its.
   */
  get commId(): string | null {
    return this._comm?.commId ?? null;
  }

  /** A mode picked here that the kernel has not confirmed yet. */
  get requested(): string | null {
    return this._requested;
  }

  /** State changes (null: tpunb went away with a restart or a kernel change). */
  get stateChanged(): ISignal<this, IKernelState | null> {
    return this._stateChanged;
  }

  /** Every other kernel message: `monitor`, `monitor_view`, `graph`, `error`. */
  get received(): ISignal<this, IKernelMessage> {
    return this._received;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Ask the kernel to make `mode` the default of the next cells. */
  setMode(mode: string): void {
    this._requested = mode;
    this.send({ type: 'set_mode', mode });
    this._stateChanged.emit(this._state);
  }

  /** Ask the kernel to make `precision` that of the next cells (`%tpu_precision`). */
  setPrecision(precision: string): void {
    this.send({ type: 'set_precision', precision });
  }

  /** Send a request to the kernel's tpunb (dropped when tpunb is not loaded there). */
  send(message: IKernelMessage): void {
    const comm = this._comm;
    if (!comm || comm.isDisposed) {
      return;
    }
    const kernel = this._kernel;
    if (kernel && this._servedOnControl(kernel, message)) {
      // a comm-info request carries it: served on control, its busy/idle ignored by the page
      const request = KernelMessage.createMessage<any>({
        msgType: 'comm_info_request',
        channel: 'control',
        session: kernel.clientId,
        username: kernel.username,
        content: {
          target_name: TARGET,
          tpunb: { ...message, comm_id: comm.commId }
        }
      });
      kernel.sendControlMessage(request, true, true);
    } else {
      comm.send(message as any);
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._detach();
    Signal.clearData(this);
  }

  private _servedOnControl(
    kernel: Kernel.IKernelConnection,
    message: IKernelMessage
  ): boolean {
    if (this._state?.control !== true) {
      return false;
    }
    const busy =
      this._cellsRunning() || kernel.status === 'busy' || this._state.busy;
    return (
      ON_CONTROL.has(message.type) ||
      (busy && ON_CONTROL_WHILE_BUSY.has(message.type))
    );
  }

  private _onKernelChanged(
    _: ISessionContext,
    change: { newValue: Kernel.IKernelConnection | null }
  ): void {
    this._detach();
    this._attach(change.newValue);
  }

  private _onStatus(_: ISessionContext, status: Kernel.Status): void {
    if (
      status === 'restarting' ||
      status === 'autorestarting' ||
      status === 'dead'
    ) {
      this._reset();
    }
  }

  private _onConnection(
    _: ISessionContext,
    status: Kernel.ConnectionStatus
  ): void {
    if (status === 'connected' && this._kernel && !this._comm) {
      void this._findOpenComm(this._kernel);
    }
  }

  private _attach(kernel: Kernel.IKernelConnection | null): void {
    this._kernel = kernel;
    if (!kernel || !kernel.handleComms) {
      return;
    }
    kernel.registerCommTarget(TARGET, (comm, message) => {
      this._use(comm, message.content.data);
      // the kernel sends on its comm only once a page has said it is there
      this.send({ type: 'hello' });
    });
    void this._findOpenComm(kernel);
  }

  /** A page that connects to a kernel that loaded tpunb earlier opens a comm of its own. */
  private async _findOpenComm(kernel: Kernel.IKernelConnection): Promise<void> {
    let reply: KernelMessage.ICommInfoReplyMsg;
    try {
      reply = await kernel.requestCommInfo({ target_name: TARGET });
    } catch {
      return; // a kernel that is restarting or gone; its next status change resets us
    }
    const content = reply.content;
    const open =
      content.status === 'ok' && Object.keys(content.comms).length > 0;
    if (open && !this._comm && this._kernel === kernel && !kernel.isDisposed) {
      const comm = kernel.createComm(TARGET);
      this._use(comm, null);
      comm.open({});
    }
  }

  private _use(comm: Kernel.IComm, data: unknown): void {
    if (
      this._comm &&
      !this._comm.isDisposed &&
      this._comm.commId !== comm.commId
    ) {
      this._comm.close();
    }
    this._comm = comm;
    comm.onMsg = message => this._onMessage(message.content.data);
    comm.onClose = () => {
      if (this._comm === comm) {
        this._reset();
      }
    };
    this._onMessage(data);
  }

  private _onMessage(data: unknown): void {
    const state = asKernelState(data);
    if (state) {
      if (
        this._requested !== null &&
        (state.default === this._requested || state.pending !== null)
      ) {
        this._requested = null; // the kernel has it: applied, or waiting for the cell to end
      }
      this._state = state;
      this._stateChanged.emit(state);
      return;
    }
    const message = data as IKernelMessage | null;
    if (message && typeof message.type === 'string') {
      if (message.type === 'error') {
        this._requested = null;
        this._stateChanged.emit(this._state);
      }
      this._received.emit(message);
    }
  }

  private _reset(): void {
    this._comm = null;
    this._requested = null;
    if (this._state !== null) {
      this._state = null;
      this._stateChanged.emit(null);
    }
  }

  private _detach(): void {
    const comm = this._comm;
    this._reset();
    if (comm && !comm.isDisposed) {
      comm.dispose();
    }
  }

  private _kernel: Kernel.IKernelConnection | null = null;
  private _comm: Kernel.IComm | null = null;
  private _state: IKernelState | null = null;
  private _requested: string | null = null;
  private _disposed = false;
  private _stateChanged = new Signal<this, IKernelState | null>(this);
  private _received = new Signal<this, IKernelMessage>(this);
}
