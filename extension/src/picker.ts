import { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { KernelLink } from './link';
import { MODES, pendingNote, pickedMode, pickedPrecision } from './state';

/**
 * The notebook toolbar's mode picker. Picking sends `set_mode` over the comm (no code goes
 * into the notebook); `%tpu_mode` in a cell moves it too, since it shows the kernel's state.
 * While a cell runs, the pick waits for that cell to end: a marker beside it says so, with
 * the whole sentence on hover.
 *
 * It is always there, at one width (style/base.css), so the toolbar never moves it into its
 * overflow menu when it appears, changes or shows a pending pick; before the kernel has
 * loaded tpunb it is disabled and says how to load it.
 */
export class ModePicker extends Widget {
  constructor(
    private readonly _link: KernelLink,
    trans: TranslationBundle
  ) {
    super();
    this.addClass('tpunb-ModePicker');
    this._select = document.createElement('select');
    this._select.className = 'tpunb-ModePicker-mode';
    this._selectTitle = trans.__('tpunb execution mode of the next cells');
    this._select.title = this._selectTitle;
    this._select.setAttribute('aria-label', trans.__('tpunb mode'));
    this._precision = document.createElement('select');
    this._precision.className = 'tpunb-PrecisionPicker';
    this._precision.title = trans.__(
      'tpunb precision of the next cells (autocast)'
    );
    this._precision.setAttribute('aria-label', trans.__('tpunb precision'));
    this._note = document.createElement('span');
    this._note.className = 'tpunb-ModePicker-note';
    this._note.setAttribute('role', 'status');
    this._notLoaded = trans.__(
      'tpunb is not loaded in this kernel: run %load_ext tpunb in a cell to pick its execution mode here'
    );
    this.node.append(this._select, this._precision, this._note);
    this._select.addEventListener('change', () =>
      this._link.setMode(this._select.value)
    );
    this._precision.addEventListener('change', () =>
      this._link.setPrecision(this._precision.value)
    );
    _link.stateChanged.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._link.stateChanged.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const state = this._link.state;
    this.toggleClass('tpunb-mod-unloaded', state === null);
    this._select.disabled = state === null;
    this._precision.disabled = state === null;
    if (state === null) {
      this._offered = this._offeredPrecisions = '';
      this._select.replaceChildren(new Option('tpunb', ''));
      this._precision.replaceChildren(new Option('fp32', ''));
      this.node.title = this._notLoaded;
      this._showNote(null);
      return;
    }
    this.node.title = '';
    const offered = MODES.filter(mode => state.modes.includes(mode));
    if (offered.join() !== this._offered) {
      this._offered = offered.join();
      this._select.replaceChildren(
        ...offered.map(mode => new Option(mode, mode))
      );
    }
    this._select.value = pickedMode(state, this._link.requested);
    const precisions = state.precisions ?? [];
    this._precision.disabled = precisions.length < 2; // older kernels, or fp32 only
    if (precisions.join() !== this._offeredPrecisions) {
      this._offeredPrecisions = precisions.join();
      this._precision.replaceChildren(...precisions.map(p => new Option(p, p)));
    }
    this._precision.value = pickedPrecision(state);
    this._showNote(pendingNote(state, this._link.requested));
  }

  /** The pending pick as a marker of fixed size; its words on hover and for screen readers. */
  private _showNote(note: string | null): void {
    this._note.title = note ?? '';
    this._note.setAttribute('aria-label', note ?? '');
    this._select.title = note ?? this._selectTitle;
    this.toggleClass('tpunb-mod-pending', note !== null);
  }

  private _select: HTMLSelectElement;
  private _precision: HTMLSelectElement;
  private _note: HTMLSpanElement;
  private _notLoaded: string;
  private _selectTitle: string;
  private _offered = '';
  private _offeredPrecisions = '';
}
