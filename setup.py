# nbdev's template setup.py: everything comes from settings.ini.
from configparser import ConfigParser
import shlex

import setuptools

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

cfg_keys = 'version description keywords author author_email'.split()
expected = cfg_keys + "lib_name user branch license status min_python audience language".split()
for o in expected:
    assert o in cfg, "missing expected setting: {}".format(o)
setup_cfg = {o: cfg[o] for o in cfg_keys}

licenses = {  # name, classifier, SPDX expression
    'apache2': (
        'Apache Software License 2.0',
        'OSI Approved :: Apache Software License',
        'Apache-2.0',
    ),
    'mit': ('MIT License', 'OSI Approved :: MIT License', 'MIT'),
}
statuses = [
    '0 - Pre-Planning',
    '1 - Planning',
    '2 - Pre-Alpha',
    '3 - Alpha',
    '4 - Beta',
    '5 - Production/Stable',
    '6 - Mature',
    '7 - Inactive',
]
py_versions = '3.10 3.11 3.12 3.13'.split()

requirements = shlex.split(cfg.get('requirements', ''))
dev_requirements = shlex.split(cfg.get('dev_requirements', ''))
docs_requirements = shlex.split(cfg.get('docs_requirements', ''))
peers_requirements = shlex.split(cfg.get('peers_requirements', ''))
lic = licenses.get(cfg['license'].lower(), (cfg['license'], None, None))
# setuptools 77 and later take the license as an SPDX expression (PEP 639) and warn at a License
# classifier; older ones (a Python 3.11 venv starts with 65) know only the name and the classifier
if lic[2] and int(setuptools.__version__.split('.')[0]) >= 77:
    license_meta, license_classifiers = {'license_expression': lic[2]}, []
else:
    license_meta, license_classifiers = (
        {'license': lic[0]},
        (['License :: ' + lic[1]] if lic[1] else []),
    )
min_python = cfg['min_python']
console_scripts = cfg.get('console_scripts', '').split()

setuptools.setup(
    name=cfg['lib_name'],
    **license_meta,
    classifiers=[
        'Development Status :: ' + statuses[int(cfg['status'])],
        'Intended Audience :: ' + cfg['audience'].title(),
        'Natural Language :: ' + cfg['language'].title(),
    ]
    + [
        'Programming Language :: Python :: ' + o
        for o in py_versions[py_versions.index(min_python) :]
    ]
    + license_classifiers,
    url=cfg['git_url'],
    # exp.mnist5k holds data, not code: named as a package of its own (setuptools otherwise warns
    # that a folder Python can import is left out), so the embedded digits go into the wheel and the
    # sdist
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*'])
    + [cfg['lib_name'] + '.mnist5k'],
    include_package_data=True,
    package_data={cfg['lib_name'] + '.mnist5k': ['*.gz']},
    install_requires=requirements,
    extras_require={
        'dev': dev_requirements,
        'docs': docs_requirements,
        'peers': peers_requirements,
    },
    python_requires='>=' + cfg['min_python'],
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={
        'console_scripts': console_scripts,
        'nbdev': [f'{cfg.get("lib_path")}={cfg.get("lib_path")}._modidx:d'],
    },
    **setup_cfg,
)
