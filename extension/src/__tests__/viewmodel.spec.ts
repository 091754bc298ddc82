import { ViewModel } from '../viewmodel';

describe('ViewModel', () => {
  it('tells listeners of changes to their value only, until they leave', () => {
    const model = new ViewModel(() => undefined);
    const seen: unknown[] = [];
    const onState = () => seen.push(model.get('state'));
    model.on('change:state', onState);
    model.set('state', { tick: 1 });
    model.set('graph', { key: 'k' });
    model.off('change:state', onState);
    model.set('state', { tick: 2 });
    expect(seen).toEqual([{ tick: 1 }]);
    expect(model.get('state')).toEqual({ tick: 2 });
  });

  it("hands the view's messages to the kernel link", () => {
    const sent: Record<string, unknown>[] = [];
    const model = new ViewModel(message => sent.push(message));
    model.send({ type: 'graph', key: 'abc' });
    expect(sent).toEqual([{ type: 'graph', key: 'abc' }]);
  });
});
