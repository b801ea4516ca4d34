# Membership is an invitation (docs/security.md): ``accepted_at`` is null while the person has not
# accepted. Adding the column fills every existing row with the migration's time, so everyone who
# is a member today stays one; new rows made by trusted code default to accepted as well, and the
# API / pages / admin create them with ``accepted_at=None``.

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_project_last_event_seq'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='membership',
            name='accepted_at',
            field=models.DateTimeField(blank=True, default=django.utils.timezone.now, help_text='null while the invitation is pending', null=True),
        ),
        migrations.AddField(
            model_name='membership',
            name='invited_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
    ]
