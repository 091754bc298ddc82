import { INotebookModel } from '@jupyterlab/notebook';

/** A change to one key of a notebook's metadata (@jupyter/ydoc's IMapChange). */
export interface IMetadataChange {
  key: string;
  oldValue?: unknown;
  newValue?: unknown;
}

/**
 * Whether a metadata change is the kernel filling in details of the language the notebook
 * already names: JupyterLab writes the kernel's whole `language_info` (its exact Python
 * version, lexer, mimetype) into every notebook it opens, so a notebook saved on another
 * machine, or with only `{"name": "python"}`, opened marked modified before anyone touched it.
 * A different language (another kernel) is a real change and is left as JupyterLab marks it.
 */
export function fillsInLanguage(change: IMetadataChange): boolean {
  if (change.key !== 'language_info') {
    return false;
  }
  const before = (change.oldValue as { name?: unknown } | undefined)?.name;
  const after = (change.newValue as { name?: unknown } | undefined)?.name;
  return typeof before === 'string' && before === after;
}

/**
 * Keeps a notebook that has no changes unmodified when its kernel fills in its language's
 * details. The model's metadata signal fires before the model marks itself dirty (in the
 * same synchronous call), so a notebook clean at that moment is marked clean again once that
 * call is done; any edit of the user's comes in a later task and marks it as usual.
 */
export function keepCleanWhenKernelFillsIn(model: INotebookModel): void {
  model.metadataChanged.connect((_, change) => {
    if (!model.dirty && fillsInLanguage(change)) {
      queueMicrotask(() => {
        model.dirty = false;
      });
    }
  });
}
