from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0005_profile'),
    ]

    operations = [
        migrations.AddField(
            model_name='project',
            name='approvals',
            field=models.JSONField(blank=True, default=list, help_text='tools whose every call waits for a person\'s approval ("*": all)'),
        ),
    ]
