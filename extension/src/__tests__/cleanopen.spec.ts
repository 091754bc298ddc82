import { fillsInLanguage } from '../cleanopen';

const KERNEL_INFO = {
  name: 'python',
  version: '3.11.7',
  mimetype: 'text/x-python',
  pygments_lexer: 'ipython3'
};

describe('fillsInLanguage', () => {
  it("is the kernel's details of the language the notebook names", () => {
    const change = {
      key: 'language_info',
      oldValue: { name: 'python' },
      newValue: KERNEL_INFO
    };
    expect(fillsInLanguage(change)).toBe(true);
    const otherVersion = {
      ...change,
      oldValue: { ...KERNEL_INFO, version: '3.12.1' }
    };
    expect(fillsInLanguage(otherVersion)).toBe(true);
  });

  it('is not another language, a first language, or another key', () => {
    const newValue = KERNEL_INFO;
    expect(
      fillsInLanguage({
        key: 'language_info',
        oldValue: { name: 'R' },
        newValue
      })
    ).toBe(false);
    expect(fillsInLanguage({ key: 'language_info', newValue })).toBe(false);
    expect(
      fillsInLanguage({
        key: 'kernelspec',
        oldValue: { name: 'python' },
        newValue
      })
    ).toBe(false);
  });
});
